"""The bench's report: the table of rows, its legend and the closing lines. Every ratio against a loop is
against the faster loop of the same row in the same run. Plain values in, text out."""
from __future__ import annotations

from syphon_bench.figures import per_batch
from syphon_bench.rows import BACKLOG_QUEUES, PRIMARY, SECONDARY, Loop, Scenario

COLUMNS = ["row", "geometry", "e2e msg/s", "loop thr", "loop aio", "loop 1", "/loop", "/30k", "cycle", "send",
           "cyc/send", "between s", "lease>1st s", "probes/b", "rt/b", "commits/b", "CPU s/1k", "emu", "loop CPU", "loop emu",
           "cyc/ceil"]
BEFORE_COLUMNS = ["row", "e2e msg/s", "before", "/before", "/loop", "before /loop", "CPU s/1k", "before CPU",
                  "CPU /before"]


def faster_loop(loops: dict) -> dict | None:
    """The faster of a row's loops (threads, asyncio, single), or None when the row ran none."""
    return max(loops.values(), key=lambda loop: loop["rate"], default=None)


def _rate(value) -> str:
    return "-" if value is None else f"{value:.0f}"


def _ratio(a, b) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}"


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def row_cells(scenario: Scenario, syphon: dict, loops: dict, ceiling) -> list[str]:
    counts = per_batch(syphon)
    best = faster_loop(loops)

    def loop_cell(kind: Loop) -> str:
        loop = loops.get(kind)
        return "-" if loop is None else f"{loop['rate']:.0f}{'*' if loop['time_bound'] else ''}"

    return [scenario.name, scenario.geometry.label(), _rate(syphon["e2e_rate"]), loop_cell(Loop.THREADS),
            loop_cell(Loop.ASYNCIO), loop_cell(Loop.SINGLE), _ratio(syphon["e2e_rate"], best and best["rate"]), "-",
            _rate(syphon["cycle_rate"]), _rate(syphon["send_rate"]), _ratio(syphon["cycle_rate"], syphon["send_rate"]),
            _seconds(syphon["between_seconds"]), _seconds(syphon.get("lease_to_first_batch_seconds")),
            f"{counts['probes']:.1f}", f"{counts['round_trips']:.0f}", f"{counts['commits']:.2f}",
            f"{syphon['cpu_per_1000']:.2f}", _seconds(syphon.get("emulator_cpu_per_1000")),
            "-" if best is None else f"{best['cpu_per_1000']:.2f}",
            "-" if best is None else _seconds(best.get("emulator_cpu_per_1000")),
            _ratio(syphon["cycle_rate"], ceiling.combined)]


def before_cells(scenario: Scenario, syphon: dict, before: dict, loops: dict) -> list[str]:
    """A row's syphon against the same row's syphon from the ``--before`` library, in the same run."""
    best = faster_loop(loops)
    rate = best and best["rate"]
    return [scenario.name, _rate(syphon["e2e_rate"]), _rate(before["e2e_rate"]),
            _ratio(syphon["e2e_rate"], before["e2e_rate"]), _ratio(syphon["e2e_rate"], rate),
            _ratio(before["e2e_rate"], rate), f"{syphon['cpu_per_1000']:.2f}", f"{before['cpu_per_1000']:.2f}",
            _ratio(syphon["cpu_per_1000"], before["cpu_per_1000"])]


def format_table(header: list[str], rows: list[list[str]]) -> list[str]:
    cells = [header] + rows
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells]


def legend(args) -> list[str]:
    return [
        "geometry: one-way latency of the secondary/primary namespace (one figure: both); e2e: from just before the "
        "Spark session is built to the return of run_syphon; loop thr / aio / 1: the plain loops (a thread per queue, "
        "completions one at a time / an asyncio task per queue, a page's completions gathered / one thread, one send "
        f"per message), * = stopped at their {args.loop_seconds:g} s bound; /loop: e2e over the faster loop of the "
        "row; /30k: e2e over the 30k row's in this run;",
        "cycle: steady rate of the whole batch cycle (batches after the first); send: the send step alone; between s: "
        "mean time per batch outside foreachBatch; lease>1st s: lease taken to first batch started;",
        "probes/b: the most probes a plan after the first took (the source's report); rt/b, commits/b: broker "
        "requests, Delta commits (audit + checkpoint) per non-empty batch; CPU s/1k: every process of the run, per "
        "1,000 messages; emu: the emulator's (the bench's process) meanwhile, which shares the cores; loop CPU, loop "
        "emu: the same for the faster loop, per 1,000 messages it moved; cyc/ceil: cycle over the emulator's combined "
        "ceiling at the row's geometry."]


def details_lines(scenario: Scenario, syphon: dict) -> list[str]:
    """A row's commits, probes, round trips, slowest gap and CPU by kind of process."""
    counts = per_batch(syphon)
    lines = [f"  {scenario.name} ({scenario.describe()}): commits audit {syphon['commits']['audit']}, checkpoint "
             f"{syphon['commits']['checkpoint']}, lease {syphon['commits']['checkpoint_lease']} over "
             f"{syphon['busy_batches']} batches; probes {syphon['ops'].get('peek_one', 0)}, round trips "
             f"{counts['round_trips'] * max(1, syphon['busy_batches']):.0f}; between batches max "
             f"{syphon['between_max_seconds'] or 0:.2f} s; CPU of the start (to the first batch) "
             f"{syphon.get('start_cpu_seconds', 0):.1f} s, of the batches {syphon.get('batches_cpu_per_1000', 0):.2f} s "
             f"per 1k, of the steady cycle (batches after the first) {syphon.get('steady_cpu_per_1000') or 0:.2f} s per "
             f"1k; CPU per 1k by process: "
             + ", ".join(f"{role} {entry['seconds'] * 1000 / scenario.messages:.2f}"
                         for role, entry in syphon["cpu_by_role"].items()
                         if entry["seconds"] * 1000 / scenario.messages >= 0.01)]
    if syphon.get("jvm_threads"):
        lines.append("  its JVMs' CPU by thread, s per 1,000 messages: " + ", ".join(
            f"{name} {seconds * 1000 / scenario.messages:.3f}" for name, seconds in syphon["jvm_threads"].items()
            if seconds * 1000 / scenario.messages >= 0.005))
    if syphon.get("python_steps"):
        lines.append("  its Python processes' CPU by step (py-spy), s per 1,000 messages: " + ", ".join(
            f"{step} {seconds * 1000 / scenario.messages:.3f}" for step, seconds in syphon["python_steps"].items()
            if seconds * 1000 / scenario.messages >= 0.005))
    if syphon.get("jvm_steps"):
        samples = sum(syphon["jvm_steps"].values())
        lines.append(f"  its driver JVM's execution samples by step (Flight Recorder, {samples}): " + ", ".join(
            f"{step} {count / samples:.1%}" for step, count in syphon["jvm_steps"].items() if count / samples >= 0.01))
    if syphon.get("commit_ms"):
        lines.append("  one Delta commit on this machine's disk (median of 6): " + ", ".join(
            f"{kind} {ms:.0f} ms" for kind, ms in syphon["commit_ms"].items()))
    return lines


def drain_seconds(syphon: dict) -> float:
    """A syphon run's drain: from its query's start to its stop (the run's timeline), when the namespaces' credits
    are spent; the Spark start and the set-up before it spend none. The whole run where the timeline lacks it."""
    marks = syphon.get("timeline") or {}
    if "QUERY_STARTED" in marks and "QUERY_STOPPED" in marks:
        return marks["QUERY_STOPPED"] - marks["QUERY_STARTED"]
    return syphon["seconds"]


def credit_lines(scenario: Scenario, syphon: dict, loops: dict) -> list[str]:
    """What a row with the namespaces' credits on spent: per second and per moved message, per namespace, and
    the share of the secondary's budget the syphon turned into moved messages (its rate over the rate its
    credits per message allow); the loops' the same way."""
    budget, moved = scenario.credits_per_second, scenario.messages

    def spending(name: str, seconds: float, messages: int, credits: dict) -> str:
        secondary, primary = credits[SECONDARY], credits[PRIMARY]
        per_message = secondary["spent"] / max(1, messages)
        allowed = budget / per_message if per_message else None
        rate = messages / seconds
        share = f", {rate / allowed:.0%} of what its credits per message allow" if allowed else ""
        return (f"  {scenario.name}: {name}: {rate:.0f} msg/s over {seconds:.1f} s; secondary {secondary['spent']:,} "
                f"credits ({secondary['spent'] / seconds:.0f}/s, {per_message:.2f} a moved message{share}), "
                f"{secondary['throttled']} operations throttled; primary {primary['spent']:,} credits "
                f"({primary['spent'] / seconds:.0f}/s, {primary['spent'] / max(1, messages):.2f} a message), "
                f"{primary['throttled']} throttled")

    lines = [spending("syphon (its query's drain)", drain_seconds(syphon), moved, syphon["credits"])]
    lines += [spending(f"loop ({kind.value})", loop["seconds"], loop["moved"], loop["credits"])
              for kind, loop in loops.items()]
    return lines


def memory_lines(memory: list, per_trigger: int) -> list[str]:
    lines = []
    for count, result in memory:
        lines.append(f"memory: driver peak at {count:,} messages (0 ms, {BACKLOG_QUEUES} queues, {per_trigger} per "
                     f"trigger): python {megabytes(result['python_peak_mb'])}, jvm {megabytes(result['jvm_peak_mb'])}; "
                     f"e2e {result['e2e_rate']:.0f} msg/s")
    if len(memory) == 2 and all(r[key] for _, r in memory for key in ("python_peak_mb", "jvm_peak_mb")):
        (small_count, small), (large_count, large) = memory
        lines.append(f"memory: ratio of the peaks at {large_count:,} / {small_count:,} messages: python "
                     f"{large['python_peak_mb'] / small['python_peak_mb']:.2f}, jvm "
                     f"{large['jvm_peak_mb'] / small['jvm_peak_mb']:.2f} (target: both within 0.90..1.10)")
    return lines


def idle_lines(idle: dict | None) -> list[str]:
    if not idle:
        return []
    return [f"idle: broker ops per backlog queue per hour: {idle['per_queue_hour']:.0f} measured with "
            f"run.idle_probe_max_seconds={idle['probe_max_seconds']:g} over {idle['window_seconds']:g} s (one peek per "
            f"queue per interval would be {idle['expected_per_queue_hour']:.0f}: "
            f"{'matches' if idle['matches'] else 'DOES NOT MATCH, so the projection does not hold'}); projected for the "
            f"default {idle['default_probe_max_seconds']:g} s: {idle['projected_per_queue_hour']:.1f} (target: at most 4)"]


def cpu_profile(profile: dict | None, messages: int, per_trigger: int) -> list[str]:
    """The profile run's CPU seconds per 1,000 messages, per kind of process and per process; beside it the
    ``--before`` library's and the asyncio loop's on the same backlog, where they ran."""
    if not profile:
        return []
    syphon = profile["syphon"]
    per_1000 = 1000 / messages
    lines = [f"CPU per 1,000 messages, {messages:,} messages at 0 ms, {BACKLOG_QUEUES} queues, {per_trigger} per "
             f"trigger, the job's processes together: {syphon['cpu_per_1000']:.2f} s (e2e {syphon['e2e_rate']:.0f} "
             "msg/s)" + "".join(f"; {name} {other['cpu_per_1000']:.2f} s (e2e {other['e2e_rate']:.0f} msg/s, now/"
                                f"{name}: CPU {syphon['cpu_per_1000'] / other['cpu_per_1000']:.2f})"
                                for name, other in (("before", profile.get("before")),) if other)
             + "".join(f"; the asyncio loop {loop['cpu_per_1000']:.2f} s ({loop['rate']:.0f} msg/s)"
                       for loop in (profile.get("loop"),) if loop) + "; by kind:"]
    lines += [f"  {role}: {entry['seconds'] * per_1000:.3f} s over {entry['processes']} process"
              f"{'es' if entry['processes'] > 1 else ''}" for role, entry in syphon["cpu_by_role"].items()
              if entry["seconds"] * per_1000 >= 0.001]  # not the shell tools spark-submit runs
    lines.append("  each process with at least 1% of the total: " + ", ".join(
        f"{p['role']} {p['pid']} {p['seconds'] * per_1000:.3f} s" for p in syphon["cpu_processes"]
        if p["seconds"] >= 0.01 * syphon["cpu_per_1000"] / per_1000))
    return lines


def megabytes(value: float | None, unit: str = " MB") -> str:
    return "-" if value is None else f"{value:.0f}{unit}"
