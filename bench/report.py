"""The printed report: one markdown table per section, then the targets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def num(value: Any, digits: int = 2) -> str:
    """A number for a table cell; '-' for a missing one."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def pct(value: float | None) -> str:
    """A fraction as a percentage for a table cell."""
    return "-" if value is None else f"{value * 100:.1f} %"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table with columns padded to line up in a terminal."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _timings(timings: dict[str, float]) -> str:
    return ", ".join(f"{name} {seconds:.3f} s" for name, seconds in timings.items())


def _error(section: dict[str, Any]) -> str | None:
    """The line to print instead of a section that failed, or None."""
    return f"FAILED: {section['error']}" if "error" in section else None


def machine(results: dict[str, Any]) -> str:
    """Machine, weights and section 1 (ceilings)."""
    m, w, c = results["machine"], results["weights"], results.get("ceilings", {})
    lines = [f"## Machine\n{m['cpu_model']}, {m['usable_cpus']} usable CPUs, torch {m['torch']}, "
             f"native bf16: {m['native_bf16']}, ANIMEGAN_BACKEND=auto and ANIMEGAN_PRECISION=auto -> "
             f"{m.get('backend_auto', 'torch')} {m['precision_auto']}"
             + (f" (timed at 256 px: {_timings(m['backend_timings_256px'])})"
                if m.get("backend_timings_256px") else ""),
             f"weights: {w['source']}"]
    if m["load_average_1m_at_start"] >= 0.5:
        lines.append(f"WARNING: the 1-minute load average was {m['load_average_1m_at_start']:.1f} at "
                     "the start: other processes were using the CPUs, so every figure is pessimistic")
    if _error(c):
        return "\n".join(lines + [_error(c)])
    lines.append("\n## 1. Matmul ceilings "
                 f"({c['matmul_n']}x{c['matmul_n']} @ {c['matmul_n']}x{c['matmul_n']}, best of {c['runs']})")
    lines.append(table(["dtype", "GFLOP/s"], [["fp32", num(c["fp32_gflops"], 1)],
                                              ["bf16", num(c["bf16_gflops"], 1)]]))
    return "\n".join(lines)


def model(results: dict[str, Any]) -> str:
    """Section 2: model compute per size and mode."""
    section = results["model"]
    head = "## 2. Model compute (median seconds per image; square inputs)"
    if _error(section):
        return f"{head}\n{_error(section)}"
    rows = [[r["size"], r["mode"], num(section["gflop"][str(r["size"])]), num(r["seconds"], 3),
             r["runs"], num(r["gflops"], 1), pct(r["ceiling_fraction"]),
             num(r["speedup_vs_fp32_nchw"]) + "x", num(r.get("vs_best_torch")) + "x"]
            for r in section["results"]]
    return (f"{head}\n" + table(["size", "mode", "GFLOP", "s", "runs", "GFLOP/s", "of ceiling",
                                 "vs fp32-nchw", "s vs best torch"], rows)
            + "\nModes are timed in turns (one run of each per round), so ratios within a size "
              "come from the same moments of the machine.")


def stages(results: dict[str, Any]) -> str:
    """Section 3, with the encode costs."""
    section = results["stages"]
    head = "## 3. Stages: 1080x1350 JPEG to"
    if _error(section):
        return f"{head} anime\n{_error(section)}"
    head += (f" {section['size']} long side ({section['output_size'][0]}x{section['output_size'][1]}),"
             f" {section.get('backend', 'torch')} {section['precision']}, median of {section['runs']}")
    rows = [[stage, num(ms), pct(section["share"][stage])]
            for stage, ms in section["stages_ms"].items()]
    rows.append(["total", num(section["total_ms"]), ""])
    rows.append(["non-inference", num(section["total_ms"] - section["stages_ms"]["inference"]),
                 pct(section["non_inference_share"])])
    if "model_ms" in section:
        rows.append(["the model alone (same input)", num(section["model_ms"]),
                     pct(section["model_ms"] / section["total_ms"])])
        rows.append(["outside the model", num(section["outside_model_ms"]),
                     pct(section["outside_model_share"])])
    if "in_process" in section:
        floor = section["in_process"]
        rows.append(["decode in this process instead (isolation thread)", num(floor["decode_ms"]),
                     ""])
        rows.append(["outside the model, decoding in this process", num(floor["outside_model_ms"]),
                     pct(floor["outside_model_share"])])
    encode = [[fmt, num(e["ms"]), e["bytes"]] for fmt, e in section["encode"].items()]
    return (f"{head}\n" + table(["stage", "ms", "share"], rows)
            + f"\n\nEncode cost of the result (quality {section['encode_quality']}):\n"
            + table(["format", "ms", "bytes"], encode))


def service(results: dict[str, Any]) -> str:
    """Section 4: the load table, per-server notes, overload and ratios."""
    section = results["service"]
    parts = [f"## 4. Service through gunicorn ({section.get('size')} long side, cache and rate "
             "limit off)"]
    rows = []
    for name, server in section.get("servers", {}).items():
        if _error(server):
            rows.append([name, "", "", _error(server)[:60], "", "", "", "", "", ""])
            continue
        for run in server["runs"]:
            lat = run["latency_s"]
            statuses = " ".join(f"{k}:{v}" for k, v in run["statuses"].items())
            rows.append([name, run["clients"], f"{run['ok']}/{run['conversions']}", statuses,
                         run["retries_503"], num(run["throughput_per_s"], 3), num(lat["p50"]),
                         num(lat["p95"]), num(lat["p99"]), num(run["cpu_s_per_image"])])
    parts.append(table(["server", "clients", "ok", "statuses", "503 retried", "conv/s",
                        "p50 s", "p95 s", "p99 s", "CPU s/img"], rows))
    for name, server in section.get("servers", {}).items():
        if "error" not in server:
            parts.append(f"- {name}: `{server['command']}`; ready after {num(server['startup_s'], 1)} s;"
                         f" first request {num(server['first_request']['seconds'])} s "
                         f"(HTTP {server['first_request']['status']})")
    overload = section.get("overload", {})
    if _error(overload):
        parts.append(f"- overload: {_error(overload)}")
    elif overload:
        parts.append(f"- overload (ANIMEGAN_MAX_QUEUE={overload['settings']['ANIMEGAN_MAX_QUEUE']}, "
                     f"{overload['clients']} clients at once, one request each): "
                     f"{overload['status_200']} x 200, {overload['status_503']} x 503; "
                     f"slowest 503 {num(overload['max_503_s'])} s, slowest 200 "
                     f"{num(overload['max_200_s'])} s")
    r = section.get("ratios", {})
    if r:
        torch_too = (f"ours/ours-torch {num(r['throughput_vs_ours_torch'])}x, "
                     if r.get("throughput_vs_ours_torch") else "")
        parts.append(f"- at {r['clients']} clients: ours/original {num(r['throughput_vs_original'])}x, "
                     f"ours/optimized {num(r['throughput_vs_optimized'])}x, {torch_too}"
                     f"ours x model time {num(r['throughput_x_model_s'])}, "
                     f"ours x inference time of this photo {num(r['throughput_x_photo_inference_s'])}")
    return "\n".join(parts)


def cache(results: dict[str, Any]) -> str:
    """Section 5: whom the cache's rule shares a result with, and a hit's time."""
    from . import cache_rule

    section = results["cache"]
    head = "## 5. Cache (the real NearDuplicateCache; times through the service)"
    if _error(section):
        return f"{head}\n{_error(section)}"
    return f"{head}\n{cache_rule.render(section)}"


def memory(results: dict[str, Any]) -> str:
    """Section 6: worker memory."""
    section = results["memory"]
    head = "## 6. Memory of ours' worker"
    if _error(section):
        return f"{head}\n{_error(section)}"
    rows = [
        ["after startup (VmRSS)", num(section["rss_at_start_mib"], 1)],
        [f"peak after {section['large_requests']} x {section['max_side']}px (VmHWM)",
         num(section["peak_rss_mib"], 1)],
        ["current after those (VmRSS)", num(section["rss_after_large_mib"], 1)],
        [f"after warm-up of {section['warmup_requests']} small", num(section["rss_before_mib"], 1)],
        [f"after {section['requests']} more small", num(section["rss_after_mib"], 1)],
    ]
    return (f"{head}\n" + table(["", "MiB"], rows)
            + f"\ngrowth {num(section['rss_growth_pct'])} %; statuses {section['small_statuses']}")


def backends(results: dict[str, Any]) -> str:
    """Section 7: each backend's start, first inference and memory."""
    section = results.get("backends")
    head = "## 7. Backends: start, first inference, memory (fresh process each)"
    if not section:
        return f"{head}\nnot measured"
    if _error(section):
        return f"{head}\n{_error(section)}"
    rows = [[r["mode"], r["start"], num(r["process_s"]), num(r["prepare_s"]),
             num(r["first_s"], 3), num(r["steady_s"], 3), num(r["first_vs_steady"]),
             num(r["steady_vs_torch_fp32"]),
             *(f"{num(r[k + '_mib'], 0)} ({num(r[k + '_vs_torch'])}x)"
               for k in ("rss_ready", "rss_served", "rss_idle", "peak"))]
            for r in section["rows"]]
    return (f"{head}, {section['size']}x{section['size']} px\n"
            + table(["mode", "model cache", "process s", "prepare s", "first s", "steady s",
                     "first/steady", "steady vs torch fp32", "RSS ready MiB (vs torch)",
                     "RSS served", "RSS idle", "peak"], rows)
            + "\nprepare: load, convert and compile (OpenVINO), fidelity check and a 256 px "
              "warm-up; cold: empty model cache, warm: the same cache again; RSS served: "
              "after the conversions, idle: a few seconds later (OpenVINO gives its buffers back).")


def jobs(results: dict[str, Any]) -> str:
    """Section 8: jobs against the photo path, the repeat rule, the saving, memory."""
    from . import jobs as section_8

    section = results.get("jobs", {})
    head = "## 8. Jobs (animations and videos, in process: Jobs.run, the worker's function)"
    if not section:
        return f"{head}\nnot measured"
    if _error(section):
        return f"{head}\n{_error(section)}"
    return f"{head}\n{section_8.render(section)}"


def colors(results: dict[str, Any]) -> str:
    """Section 9: colour keeping, how close to the input's colours and what it costs."""
    from . import colors as section_9

    section = results.get("colors", {})
    head = "## 9. Colour keeping (colors=off|luma|keep, in process)"
    if not section:
        return f"{head}\nnot measured"
    if _error(section):
        return f"{head}\n{_error(section)}"
    return f"{head}\n{section_9.render(section)}"


def targets(results: dict[str, Any]) -> str:
    """The targets table."""
    rows = [[t["target"], t["goal"], num(t["measured"], 3),
             {True: "pass", False: "MISS", None: "n/a"}[t["pass"]]] for t in results["targets"]]
    return "## Targets\n" + table(["target", "goal", "measured", "result"], rows)


def render(results: dict[str, Any]) -> str:
    """The whole report as text."""
    blocks = [f"# flask-animegan benchmark{' (--quick: smoke sizes, not the real figures)' if results['quick'] else ''}"]
    for part in (machine, model, stages, service, cache, memory, backends,
                 jobs, colors, targets):
        blocks.append(part(results))
    blocks.append(f"Took {results['duration_s']:.0f} s.")
    return "\n\n".join(blocks)
