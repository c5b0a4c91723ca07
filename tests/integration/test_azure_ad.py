"""Azure AD without keys, end to end: the emulator in Azure AD mode (``conf/emulator-azure-ad.yaml``: both
namespaces refuse shared access keys and take tokens signed with its test key), the syphon with
``conf/local-azure-ad.yaml`` (a ``custom`` credential kind whose factory signs such tokens, taken on
the driver and in every executor process), the unmodified SDK, real Spark and Delta.

- A continuous run whose tokens live 40 seconds: backlog messages written before, at the first tokens'
  renewal and after their expiry all arrive once, the token requests per process stay a handful, and
  neither the signing key nor a token shows in the job's output, its log or the audit.
- A destination without Send (dead-lettered naming the role, re-driven after the grant, the dry run and the
  source's plan showing no secret) is ``test_network_paths``' WebSocket run, with Azure AD through a proxy.
- Listen missing on one backlog queue, and a connection string where local auth is off: the pre-flight
  ends the job with exit code 2 and one line within seconds, nothing moved.
- Manage missing for ``--decommission --confirm``: exit code 2 and one line naming Data Owner, nothing removed.
"""

from __future__ import annotations

import collections
import time
from contextlib import contextmanager

import pytest
import yaml

from backlog_syphon.config import CredentialConfig, NamespaceConfig, Secret, load_config
from backlog_syphon.servicebus.peek import peek_counts
from tools.backlog_writer import realistic_backlog, send_legacy_backlog, write_backlog
from tools.testing import drain_destinations, expected_arrivals

from .conftest import PRIMARY, ROOT, SECONDARY
from .helpers import finish_job, job_command, job_env, kill_tree, read_with_deltalake, start_job, tail, wait_for

SIGNING_KEY = "local-emulator-signing-key"  # conf/emulator-azure-ad.yaml's test key
SYPHON, TOOLING = "backlog-syphon", "tooling"  # its principals: the job's, and the tests' own (Data Owner)
SENDER, RECEIVER = "Azure Service Bus Data Sender", "Azure Service Bus Data Receiver"
BACKLOG = [f"{PRIMARY}/x-servicebus-transfer/{index}" for index in range(10)]
DESTINATIONS = ["orders", "payments", "sessions-orders", "events/all", "events/eu"]
FACTORY = "servicebus_emulator.aad:credential"
JWT_START = "eyJ"  # every JSON web token starts so (base64 of '{"')
# The continuous run's tokens: short-lived, so that it outlives them (renewed half-way, as
# ``access.token_needs_renewal`` does for a short-lived token), with seconds of margin for the SDK, which
# renews a link's token once 90 % of its life has passed.
TOKEN_SECONDS = 40


@contextmanager
def aad_emulator(**syphon_roles):
    """conf/emulator-azure-ad.yaml on free ports; ``primary=`` / ``secondary=``: the job's role assignments
    there instead of the file's, as (role, scope) pairs."""
    from servicebus_emulator import Emulator, EmulatorConfig

    raw = yaml.safe_load((ROOT / "conf/emulator-azure-ad.yaml").read_text())
    for namespace in raw["namespaces"]:
        roles = syphon_roles.get("primary" if namespace["name"] == PRIMARY else "secondary")
        if roles is not None:
            assignments = namespace["azure_ad"]["role_assignments"]
            assignments[:] = [a for a in assignments if a["principal"] != SYPHON] + [
                {"principal": SYPHON, "role": role, "scope": scope} for role, scope in roles]
    with Emulator(EmulatorConfig.from_dict(raw), ports={PRIMARY: 0, SECONDARY: 0}) as emulator:
        yield emulator


def host(emulator, namespace: str) -> str:
    return f"127.0.0.1:{emulator.port(namespace)}"


def tooling(emulator, namespace: str) -> NamespaceConfig:
    """What the tests write and check with: the emulator's Data Owner principal."""
    return NamespaceConfig(fully_qualified_namespace=host(emulator, namespace), use_development_emulator=True,
                           credential=CredentialConfig("custom", factory=FACTORY, options={"principal": TOOLING},
                                                       secret=Secret(SIGNING_KEY, "test")))


def addresses(emulator) -> dict[str, str]:
    """Where each namespace listens: AMQP, and the administration API with the certificate to trust."""
    found = {}
    for role, namespace in (("primary", PRIMARY), ("secondary", SECONDARY)):
        found[f"{role}.fully_qualified_namespace"] = host(emulator, namespace)
        found[f"{role}.administration_endpoint"] = emulator.admin_endpoint(namespace)
        found[f"{role}.ca_file"] = emulator.ca_file
    return found


def aad_config(emulator, tmp_path, **overrides):
    settings = {**addresses(emulator), "storage.audit_table": str(tmp_path / "audit"),
                "storage.checkpoint_table": str(tmp_path / "checkpoint"),
                "storage.checkpoint_location": str(tmp_path / "checkpoint-stream"), **overrides}
    return load_config(ROOT / "conf/local-azure-ad.yaml", environ={"SB_EMULATOR_SIGNING_KEY": SIGNING_KEY},
                       overrides=settings)


def aad_job(emulator, tmp_path, **settings) -> list[str]:
    return job_command(tmp_path, "conf/local-azure-ad.yaml",
                       **{key.replace(".", "__"): value for key, value in addresses(emulator).items()}, **settings)


def backlog_totals(emulator) -> dict[str, int]:
    return {path: entry["total"] for path, entry in emulator.stats(SECONDARY).items() if path in BACKLOG}


def assert_no_secret(text: str, where: str) -> None:
    assert SIGNING_KEY not in text, f"the signing key shows in {where}"
    assert JWT_START not in text, f"a token shows in {where}"


@pytest.mark.timeout(900)
def test_a_continuous_run_renews_short_lived_tokens_and_delivers_every_message_once(tmp_path):
    issued = tmp_path / "tokens-issued"  # one line per token the credential signed: "<pid> <time>"
    credential = (f"{{kind: custom, factory: '{FACTORY}', secret: {{env: SB_EMULATOR_SIGNING_KEY}}, options: "
                  f"{{principal: {SYPHON}, lifetime_seconds: {TOKEN_SECONDS}, issued_log: '{issued}'}}}}")
    waves = [realistic_backlog(100, seed=seed, body_size=100) for seed in (31, 32, 33)]
    with aad_emulator() as emulator:
        secondary = tooling(emulator, SECONDARY)
        write_backlog(secondary, PRIMARY, waves[0], queue_count=10, seed=31)
        command = aad_job(emulator, tmp_path, run__trigger="2 seconds", run__max_messages_per_trigger=50,
                          primary__credential=credential, secondary__credential=credential)
        env = job_env(emulator, {"SB_EMULATOR_SIGNING_KEY": SIGNING_KEY, "SYPHON_LOG_FILE": str(tmp_path / "job.log")})
        job = start_job(command, env, tmp_path / "job.out")
        try:
            drained = lambda: job.poll() is None and sum(backlog_totals(emulator).values()) == 0  # noqa: E731
            # (a generous wait: on a loaded machine a job's start alone has taken over two minutes)
            assert wait_for(drained, 420, interval=0.5), tail(tmp_path / "job.out")
            first_token = min(float(line.split()[1]) for line in issued.read_text().splitlines())
            # The second wave once the first tokens were renewed (half-way), the third once they expired.
            for wave, at in ((waves[1], TOKEN_SECONDS * 0.6), (waves[2], TOKEN_SECONDS * 1.2)):
                time.sleep(max(0.0, first_token + at - time.time()))
                write_backlog(secondary, PRIMARY, wave, queue_count=10, seed=int(at))
                assert wait_for(drained, 180, interval=0.5), tail(tmp_path / "job.out")
            job.send_signal(15)  # stop politely after the batch in flight
            code = finish_job(job, 120)
        finally:
            if job.poll() is None:
                kill_tree(job)
        output = (tmp_path / "job.out").read_text()
        assert code == 0, output[-4000:]
        assert "stopped on request" in output

        originals = [message for wave in waves for message in wave]
        arrived = drain_destinations(tooling(emulator, PRIMARY), DESTINATIONS, session_entities=["sessions-orders"],
                                     settle_seconds=1.0)
        assert collections.Counter({entity: len(messages) for entity, messages in arrived.items()}) == \
            expected_arrivals(originals)
        for entity, messages in arrived.items():  # each once
            ids = [str(message.message_id) for message in messages]
            assert len(ids) == len(set(ids)), entity
        assert peek_counts(secondary, BACKLOG) == dict.fromkeys(BACKLOG, 0)
        audit = read_with_deltalake_rows(tmp_path / "audit")
        assert collections.Counter(row["outcome"] for row in audit) == {"delivered": len(originals)}
        assert len({(row["backlog_queue"], row["sequence_number"]) for row in audit}) == len(originals)
        put_tokens = sum(emulator.auth_stats(namespace).get("jwt", 0) for namespace in (PRIMARY, SECONDARY))
        refused = sum(emulator.auth_stats(namespace).get("refused", 0) for namespace in (PRIMARY, SECONDARY))

    # Tokens: once per process and lifetime, never per task or message.
    per_process = collections.defaultdict(list)
    for line in issued.read_text().splitlines():
        pid, at = line.split()
        per_process[int(pid)].append(float(at))
    requests = {pid: len(times) for pid, times in per_process.items()}
    batches = len({row["batch_id"] for row in audit})
    send_tasks = len({(row["batch_id"], row["backlog_queue"]) for row in audit})  # one per backlog queue and batch
    print(f"\ntoken requests per process ({TOKEN_SECONDS} s tokens, {batches} batches and {send_tasks} send tasks "
          f"with messages, {len(originals)} messages): "
          f"{sorted(requests.values(), reverse=True)}; {put_tokens} put-tokens on the links; "
          f"{max(times[-1] for times in per_process.values()) - first_token:.0f} s from the first token to the last")
    assert refused == 0
    for pid, times in per_process.items():  # renewed half-way through a token's life, not sooner
        assert len(times) <= 2 + (times[-1] - times[0]) / (TOKEN_SECONDS / 2), (pid, times)
    assert max(requests.values()) >= 2, "no process renewed its token although the run outlived it"
    assert put_tokens > 2 * sum(requests.values()), "the links did not share their process's token"

    for path in (tmp_path / "job.out", tmp_path / "job.log"):
        assert_no_secret(path.read_text(), path.name)
    assert_no_secret(str(audit), "the audit")


def read_with_deltalake_rows(table_path) -> list[dict]:
    from deltalake import DeltaTable

    read_with_deltalake(table_path)  # readable by another Delta reader
    return DeltaTable(str(table_path)).to_pyarrow_table().to_pylist()


@pytest.mark.parametrize("case", ["listen missing on one backlog queue", "a connection string where local auth is off"])
def test_the_pre_flight_ends_the_job_with_one_line_naming_what_to_grant_or_use(tmp_path, case):
    listen_but_on_3 = [(RECEIVER, queue) for queue in BACKLOG if not queue.endswith("/3")]
    with aad_emulator(secondary=listen_but_on_3) as emulator:
        originals = realistic_backlog(30, seed=51, body_size=50)
        send_legacy_backlog(tooling(emulator, SECONDARY), {queue: originals[index::10]
                                                          for index, queue in enumerate(BACKLOG)})
        before = backlog_totals(emulator)
        assert set(before.values()) == {3}
        env = job_env(emulator, {"SB_EMULATOR_SIGNING_KEY": SIGNING_KEY})
        if case.startswith("listen"):
            command = aad_job(emulator, tmp_path)
            expected = (f"the secondary namespace refused Listen on {PRIMARY}/x-servicebus-transfer/3: grant Azure "
                        f"Service Bus Data Receiver")
        else:  # the keys conf/local.yaml reads are what the emulator would take, were local auth on
            command = job_command(tmp_path)
            expected = (f"local authentication is disabled on {host(emulator, SECONDARY)}: use Azure AD "
                        f"(fully_qualified_namespace and credential)")
        started = time.monotonic()
        code = finish_job(start_job(command, env, tmp_path / "job.out"), 60)
        seconds = time.monotonic() - started
        output = (tmp_path / "job.out").read_text()
        print(f"\n{case}: exit code {code} after {seconds:.1f} s")
        assert code == 2, output[-3000:]
        assert seconds < 30, f"took {seconds:.1f} s"
        errors = [line for line in output.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and expected.replace("(fully_qualified_namespace and credential)",
                                                     "(secondary.fully_qualified_namespace and secondary.credential)") \
            in errors[0], output[-3000:]
        assert "Traceback" not in output
        assert_no_secret(output, "the job's output")
        assert backlog_totals(emulator) == before
        assert all(entry["in"] == 0 for entry in emulator.stats(PRIMARY).values())


def test_a_credential_that_cannot_get_a_token_is_named_by_the_pre_flight(tmp_path, monkeypatch):
    from backlog_syphon.servicebus.preflight import PreflightError, preflight

    for name in ("AZURE_FEDERATED_TOKEN_FILE", "AZURE_CLIENT_ID", "AZURE_TENANT_ID"):
        monkeypatch.delenv(name, raising=False)  # no Kubernetes here: workload identity has no token file
    with aad_emulator() as emulator:
        config = aad_config(emulator, tmp_path, **{"secondary.credential": "workload_identity"})
        with pytest.raises(PreflightError) as failed:
            preflight(config)
    line = str(failed.value)
    assert line.startswith("secondary.credential (workload_identity) could not get an Azure AD token (")
    assert line.endswith("set token_file (or AZURE_FEDERATED_TOKEN_FILE), client_id and tenant_id")


def test_decommission_without_manage_ends_with_one_line_naming_data_owner(tmp_path, spark, capsys, monkeypatch,
                                                                          command_line):
    """The job's identity has Data Receiver on the secondary namespace, not Data Owner: ``--decommission
    --confirm`` ends with exit code 2 and one line naming the role, before anything is read or removed."""
    from backlog_syphon.cli import main as cli_main

    monkeypatch.setenv("SB_EMULATOR_SIGNING_KEY", SIGNING_KEY)
    with aad_emulator() as emulator:
        before = backlog_totals(emulator)
        settings = {**addresses(emulator), "storage.audit_table": tmp_path / "audit",
                    "storage.checkpoint_table": tmp_path / "checkpoint",
                    "storage.checkpoint_location": tmp_path / "stream"}
        command = ["--config", str(ROOT / "conf/local-azure-ad.yaml"), "--decommission", "--confirm",
                   "--log-file", str(tmp_path / "run.log")]
        for key, value in settings.items():
            command += ["--set", f"{key}={value}"]
        code = cli_main(command)
        assert backlog_totals(emulator) == before
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert (code, out, len(errors)) == (2, "", 1), err[-3000:]
    assert errors[0] == (f"error: the secondary namespace refused Manage on {PRIMARY}/x-servicebus-transfer/*: grant "
                         f"Azure Service Bus Data Owner (on it, or on the namespace) to the identity of "
                         f"secondary.credential (custom 'servicebus_emulator.aad:credential') (removing backlog queues "
                         f"takes Manage)")
    assert_no_secret(err, "the command's output")
    assert not any(path.name in ("audit", "checkpoint_lease", "checkpoint_runs") for path in tmp_path.iterdir())
