"""Moving a session-enabled source's session states to the target, before the migration run sends anything.

Per source: its sessions are listed (``get-message-sessions`` in its default mode: "sessions with active messages
or stored session state", the SDK's ``list_queue_sessions``); each session with a state gets it set on the target's
session of the same id (``Route.session_state_entity``: the route's queue, or the target topic's subscription of
the same name), then cleared in the source. Both sides take the session's lock for the moment (a session
receiver, which receives nothing).

Invariants:
- a state is cleared in the source only once the target holds it: a crash in between sets it again, with the
  same bytes, on the next run;
- a session whose lock another receiver holds (on either side) keeps its state in the source and is named: the
  next run moves it; nothing else waits for it.
"""

from __future__ import annotations

import logging

from azure.servicebus.exceptions import OperationTimeoutError, SessionCannotBeLockedError

from backlog_syphon.config import NamespaceConfig
from backlog_syphon.model import MigrationPlan, SessionStates, SourceEntity
from backlog_syphon.servicebus.clients import each_at_once, session_receiver
from backlog_syphon.servicebus.clients import open_client

logger = logging.getLogger(__name__)


def listed_sessions(namespace: NamespaceConfig, source: SourceEntity) -> list[str]:
    """The sessions of a session-enabled source with messages or a state (each once, in the listed order)."""
    with open_client(namespace, role="secondary") as client:
        if source.subscription is not None:
            found = client.list_subscription_sessions(source.topic, source.subscription)
        else:
            found = client.list_queue_sessions(source.path)
        return list(dict.fromkeys(found))


def move_session_states(source_ns: NamespaceConfig, target_ns: NamespaceConfig, plan: MigrationPlan) -> list[SessionStates]:
    """Move every session state of the plan's session-enabled sources that has somewhere to go (one source at a
    time per thread, its sessions one after the other)."""
    sources = [source for source in plan.sources if source.requires_session]

    def move(source: SourceEntity) -> SessionStates:
        route = plan.route(source.path)
        target = route.session_state_entity if route is not None else None
        moved, left = [], {}
        for session in listed_sessions(source_ns, source):
            try:
                with session_receiver(source_ns, source.path, session) as receiver:
                    state = receiver.session.get_state()
                    if not state:
                        continue
                    if target is None:
                        left[session] = "the target takes no session state (not session-enabled)"
                        continue
                    with session_receiver(target_ns, target, session, role="primary") as on_target:
                        on_target.session.set_state(state)
                    receiver.session.set_state(None)
                    moved.append(session)
            except (SessionCannotBeLockedError, OperationTimeoutError) as exc:
                left[session] = f"its session is locked by another receiver ({type(exc).__name__})"
        if moved or left:
            logger.info("source=%s session states moved to %s: %d; left in the source: %d%s", source.path, target,
                        len(moved), len(left), f" ({'; '.join(f'{s}: {why}' for s, why in left.items())})"[:500]
                        if left else "")
        return SessionStates(source.path, tuple(moved), left)

    return list(each_at_once(sources, move, name="session-states").values())
