"""The administration API (ATOM over HTTPS) that ``ServiceBusAdministrationClient`` speaks: one HTTPS server
per namespace on a port of its own, as Microsoft's emulator serves it on 5300 since its 2.0 release.

It answers GET of queues, topics and subscriptions (properties and runtime counts) and their paged lists
from the live broker state, and DELETE of a queue; anything else is a 501 that names what is not served. See
``admin_routes`` (paths), ``admin_auth`` (who may ask), ``admin_views`` (what is reported) and
``admin_atom`` (the documents).

Invariants:
- servers listen on their namespace's host (127.0.0.1 unless configured) only;
- broker state is read on the broker's loop thread only (``Server.call``); a request thread never touches it;
- a request is authenticated before anything is looked up; a queue or topic that does not exist is the
  service's empty feed (200) even for a caller without Manage, an existing one needs Manage (as on Azure);
- a read is a management operation: it costs the namespace ten credits, and a namespace out of credits (or
  switched ``server-busy``) answers it 503 with the service's throttling text (``credits``);
- deleting a queue needs Manage (a key with it, or Data Owner on the namespace or the queue) before anything
  is looked up or changed: the service's 401 otherwise; a queue that does not exist is a 404;
- each response is delayed by the namespace's latency (one round trip), like the AMQP side's frames.
"""
from __future__ import annotations

import logging
import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Optional
from urllib.parse import quote

from . import aad, admin_atom, admin_views, cbs, fault_switches
from .credits import CreditKind
from .limits import MANAGEMENT_OPERATION_CREDITS
from .admin_auth import (MANAGE_CLAIMS_REQUIRED, Caller, Unauthenticated, authenticate, subscription_refusal)
from .admin_routes import BadRequest, Route, RouteKind, route
from .admin_views import EntityKind

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_SECONDS = 10.0
ENTRY_TYPE = "application/atom+xml;type=entry;charset=utf-8"
FEED_TYPE = "application/atom+xml;type=feed;charset=utf-8"
ERROR_TYPE = "application/xml; charset=utf-8"
NOT_SERVED = ("The emulator's administration API does not serve {what}. It answers GET of queues, topics and "
              "subscriptions (properties and runtime counts) and their lists, and DELETE of a queue; entities come "
              "from the emulator's configuration (or Emulator.add_queue at run time).")


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes = b""
    content_type: str = ERROR_TYPE
    reason: Optional[str] = None      # None: the standard phrase


class NamespaceApi:
    """The answers of one namespace's administration API (the request threads call ``answer``)."""

    def __init__(self, server, name: str):
        self.server = server
        self.ns = server.namespaces[name]
        self.cfg = self.ns.cfg
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"https://{self.cfg.host}:{self.port}"

    def answer(self, method: str, target: str, authorization: Optional[str]) -> Reply:
        path = target.partition("?")[0].strip("/") or "$Resources"
        try:
            request = route(method, target)
            caller = authenticate(self.cfg, authorization)
        except BadRequest as exc:
            return self._error(400, str(exc), path)
        except Unauthenticated as exc:
            return self._error(401, str(exc), path)
        if request.kind is RouteKind.UNSUPPORTED:
            return self._error(501, NOT_SERVED.format(what=request.unsupported), path)
        refusal = self.server.call(self.ns.load_refusal, CreditKind.ADMINISTRATION, path)
        if refusal is not None:
            return Reply(503, admin_atom.error_document(503, refusal.description))
        self.server.call(self.ns.spend, CreditKind.ADMINISTRATION, MANAGEMENT_OPERATION_CREDITS)
        if request.kind is RouteKind.DELETE_ENTITY:
            return self._delete(caller, request.entity, path)
        if request.kind is RouteKind.GET_ENTITY:
            view = self.server.call(admin_views.find_entity, self.ns, request.entity)
            if view is None:
                return self._not_found(target)
            if not self._may_manage(caller, view.name):
                return self._error(401, MANAGE_CLAIMS_REQUIRED, path)
            return Reply(200, admin_atom.entry_document(view, self.base_url, self.cfg.name), ENTRY_TYPE)
        if request.kind is RouteKind.LIST_ENTITIES:
            if not self._may_manage(caller, ""):
                return self._error(401, MANAGE_CLAIMS_REQUIRED, path)
            views = self.server.call(admin_views.list_entities, self.ns, request.list_kind)
            return self._page(request, views, f"$Resources/{admin_atom.FEED_TITLES[request.list_kind]}")
        topic_path = f"{quote(request.entity, safe='')}/subscriptions"
        if request.kind is RouteKind.GET_SUBSCRIPTION:
            if not self._may_manage(caller, f"{request.entity}/subscriptions/{request.subscription}"):
                return self._refuse_subscription("GetSubscription", target)
            view = self.server.call(admin_views.find_subscription, self.ns, request.entity, request.subscription)
            if view is None:
                return self._not_found(target)
            return Reply(200, admin_atom.entry_document(view, self.base_url, self.cfg.name), ENTRY_TYPE)
        if request.kind is RouteKind.LIST_RULES:
            if not self._may_manage(caller, f"{request.entity}/subscriptions/{request.subscription}"):
                return self._refuse_subscription("EnumerateRules", target)
            rules = self.server.call(admin_views.list_rules, self.ns, request.entity, request.subscription)
            if rules is None:
                return self._not_found(target)
            return self._rule_page(request, rules,
                                   f"{topic_path}/{quote(request.subscription, safe='')}/rules")
        if not self._may_manage(caller, request.entity):
            return self._refuse_subscription("EnumerateSubscriptions", target)
        views = self.server.call(admin_views.list_subscriptions, self.ns, request.entity)
        return self._page(request, views, topic_path)

    def _rule_page(self, request: Route, rules, feed_path: str) -> Reply:
        def url(skip: int) -> str:
            return f"{self.base_url}/{feed_path}?$skip={skip}&$top={request.top}&api-version={admin_atom.API_VERSION}"

        end = request.skip + request.top
        next_url = url(end) if request.top and end < len(rules) else None
        return Reply(200, admin_atom.rule_feed_document(rules[request.skip:end], url(request.skip), next_url,
                                                        _now_ms()), FEED_TYPE)

    def _delete(self, caller: Caller, name: str, path: str) -> Reply:
        """DELETE of a queue: Manage first (nothing is looked up for a caller without it), then 404 for a name
        that is no queue, else the queue goes with its dead-letter queue and messages (``Emulator.delete_queue``)."""
        if not self._may_manage(caller, name):
            return self._error(401, MANAGE_CLAIMS_REQUIRED, path)
        view = self.server.call(admin_views.find_entity, self.ns, name)
        if view is None:
            return self._error(404, f"The messaging entity '{name}' could not be found. "
                                    f"(MessagingEntityNotFound)", path)
        if view.kind is not EntityKind.QUEUE:
            return self._error(501, NOT_SERVED.format(what="deleting topics"), path)
        self.server.call(fault_switches.delete_queue, self.ns, name)
        return Reply(200)

    def _may_manage(self, caller: Caller, path: str) -> bool:
        if caller.principal is None:
            return aad.MANAGE in caller.key_rights
        return aad.MANAGE in self.server.call(cbs.rights, self.ns, caller.principal, path.lower())

    def _page(self, request: Route, views, feed_path: str) -> Reply:
        def url(skip: int) -> str:
            return f"{self.base_url}/{feed_path}?$skip={skip}&$top={request.top}&api-version={admin_atom.API_VERSION}"

        end = request.skip + request.top
        next_url = url(end) if request.top and end < len(views) else None
        kind = request.list_kind or EntityKind.SUBSCRIPTION
        body = admin_atom.feed_document(kind, views[request.skip:end], url(request.skip), next_url, self.base_url,
                                        self.cfg.name, _now_ms())
        return Reply(200, body, FEED_TYPE)

    def _not_found(self, target: str) -> Reply:
        return Reply(200, admin_atom.not_found_document(f"{self.base_url}{target}", _now_ms()), FEED_TYPE)

    def _refuse_subscription(self, operation: str, target: str) -> Reply:
        return Reply(401, reason=subscription_refusal(operation, f"sb://{self.cfg.host}:{self.port}{target}"))

    def _error(self, status: int, detail: str, path: str) -> Reply:
        return Reply(status, admin_atom.error_document(status, self.ns.described(detail, path)))


class AdminApi:
    """The administration API of every namespace: ``start(context)`` binds each namespace's port (``ports``;
    0 = free) and serves it with the certificate of ``context`` (``admin_tls``)."""

    def __init__(self, server, ports: Dict[str, int]):
        self.apis = {name: NamespaceApi(server, name) for name in server.namespaces}
        self._ports = ports
        self._servers: list = []

    def start(self, context: ssl.SSLContext) -> None:
        bound = []
        try:
            for name, api in self.apis.items():
                bound.append(_HttpsServer((api.cfg.host, self._ports.get(name, api.cfg.admin_port)), context, api))
                api.port = bound[-1].server_address[1]
        except OSError:
            for httpd in bound:
                httpd.server_close()
            raise
        for httpd in bound:           # every port is bound: serve them all
            threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True,
                             name=f"servicebus-emulator-admin-{httpd.api.cfg.name}").start()
        self._servers = bound

    def stop(self) -> None:
        for httpd in self._servers:
            httpd.shutdown()          # returns once its serve_forever has ended
            httpd.server_close()
        self._servers = []


class _HttpsServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True        # a restarted emulator takes its ports back at once

    def __init__(self, address, context: ssl.SSLContext, api: NamespaceApi):
        self.context, self.api = context, api
        super().__init__(address, _Handler)

    def finish_request(self, request, client_address):
        # the handshake runs on the request's own thread, so a slow or refusing client holds up no one
        request.settimeout(HANDSHAKE_TIMEOUT_SECONDS)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            log.debug("administration API: TLS handshake with %s failed: %s", client_address, exc)
            return
        tls.settimeout(None)
        try:
            super().finish_request(tls, client_address)
        finally:
            tls.close()

    def handle_error(self, request, client_address):
        log.debug("administration API: request from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"     # keep-alive: one TLS handshake per client connection, not per request
    disable_nagle_algorithm = True    # headers and body go out in two writes: no delayed-ACK stall between
    timeout = 120                     # an idle kept-alive connection ends, and its thread with it
    server_version = "servicebus-emulator"
    sys_version = ""

    def do_GET(self):
        self._serve()

    do_PUT = do_DELETE = do_POST = do_PATCH = do_HEAD = do_GET

    def _serve(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)   # not used; read so that the next request on the connection parses
        api: NamespaceApi = self.server.api
        reply = api.answer(self.command, self.path, self.headers.get("Authorization"))
        if api.ns.latency_ms:
            time.sleep(api.ns.latency_ms / 1000)     # the namespace's round trip
        self.send_response(reply.status, reply.reason)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply.body)

    def log_message(self, format, *args):
        log.debug("administration API %s: " + format, self.server.api.cfg.name, *args)


def _now_ms() -> int:
    return int(time.time() * 1000)

