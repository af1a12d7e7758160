"""The terminal table and the plots of ``specchaos sweep`` (the sweep itself is
:mod:`harness.experiment.sweep`; this module only presents ``policy.json``'s dict)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")   # no display: CI, servers   # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from rich.console import Group, RenderableType  # noqa: E402
from rich.table import Table  # noqa: E402
from rich.text import Text  # noqa: E402

__all__ = ["render_sweep", "plot_sweep"]

_FIGS = (("throughput", "tok/s"), ("tpot_p50", "TPOT p50"), ("itl_p50", "ITL p50"), ("ttft_p50", "TTFT p50"),
         ("goodput", "goodput"))
_VERDICT_STYLE = {"gain": "green", "loss": "red", "implausible": "bold magenta", "inconclusive": "yellow",
                  "no acceptance": "red", "unmeasured": "dim"}


def _speed(f: dict[str, Any] | None) -> str:
    if not f or f.get("speedup") is None:
        return "—"
    # an interval with one open end (too few resamples on one side) is shown as "?"
    low, high = (("?" if f.get(k) is None else f"{f[k]:.2f}") for k in ("low", "high"))
    ci = "" if f.get("low") is None and f.get("high") is None else f" [{low}, {high}]"
    return f"{f['speedup']:.2f}{ci}"


def _style(f: dict[str, Any] | None) -> str | None:
    if not f or f.get("speedup") is None:
        return "dim"
    if f.get("high") is not None and f["high"] < 1:
        return "red"
    return "green" if f.get("low") is not None and f["low"] >= 1 else None


def _acc(c: dict[str, Any]) -> str:
    a, v = c.get("acceptance_rate"), c.get("vllm_acceptance_rate")
    return f"{'—' if a is None else format(a, '.2f')}/{'—' if v is None else format(v, '.2f')}"


def render_sweep(summary: dict[str, Any]) -> RenderableType:
    """Every cell's acceptance (client/vLLM), draft cost c, bound, blocks and speedups with
    their intervals (red: a net loss with confidence; green: a gain with confidence) and
    its verdict, then the policy's lines and the sweep's counts."""
    kind = summary["level_kind"]
    conf = summary.get("confidence", 0.95)
    tab = Table(title=f"speculative vs plain, speedup (> 1: speculation helps) with {conf * 100:g}% bootstrap "
                      f"interval over blocks; {summary['figure']} decides", title_justify="left")
    for col in ("speculator", "k", kind, "bucket", "sampling", "α cl/vLLM", "c", "bound", "blocks",
                *(n for _, n in _FIGS), "verdict", "n"):
        tab.add_column(col, justify="left" if col in ("speculator", "bucket", "sampling", "verdict") else "right")
    for c in sorted(summary["cells"], key=lambda c: (c["speculator"], c["k"], c["bucket"], c["sampling"], c["level"])):
        dc = c.get("draft_cost") or {}
        b = (c.get("bound") or {}).get("speedup_bound")
        verdict = c.get("verdict") or ""
        tab.add_row(c["speculator"], str(c["k"]), f"{c['level']:g}", c["bucket"], c["sampling"], _acc(c),
                    f"{dc.get('c', 0):.2f}" + ("" if dc.get("measured") else "*"),
                    "—" if b is None else f"{b:.2f}", str(c.get("blocks", 1)),
                    *(Text(_speed(c["speedup"].get(f)), style=_style(c["speedup"].get(f)) or "") for f, _ in _FIGS),
                    Text(verdict, style=_VERDICT_STYLE.get(verdict, "")),
                    f"{c['complete']['spec']}/{c['complete']['plain']}")
    parts: list[RenderableType] = [tab, Text("  c*: draft cost not measured, the bound uses c = 0 (the most generous)",
                                             style="dim")]
    pol = summary.get("policy")
    if pol:
        parts.append(Text(_policy_line(pol), style="bold" if pol["enabled"] else "bold yellow"))
        for r in pol["k_by_bucket"]:
            steps = ", ".join(f"{d['level']:g}: {d['verdict']}" for d in r.get("decisions", []))
            parts.append(Text(f"  {r['bucket']} ({r['min_prompt_tokens']}-{r['max_prompt_tokens']} tokens): "
                              f"k={r['k']}, {_speed(r)}, {'on' if r['enabled'] else 'off'}; by {kind}: {steps}"))
        for spec, rows in sorted((pol.get("others") or {}).items()):
            parts.append(Text(f"  {spec}: " + "; ".join(
                f"{r['bucket']} k={r['k']} " + ", ".join(f"{d['level']:g}: {d['verdict']}" for d in r["decisions"])
                for r in rows)))
        br = pol.get("breaker")
        if br:
            soft = "" if br["soft_rejection"] is None else \
                f", soft trip at {br['soft_rejection']:.2f} to k={br['soft_num_speculative_tokens']}"
            parts.append(Text(f"  breaker: hard trip at rejection {br['hard_rejection']:.2f} (the bound crosses 1 at "
                              f"acceptance {br['acceptance_threshold']:.2f} for k={br['k']}, measured c={br['c']:.2f})"
                              f"{soft}"))
        for n in pol["notes"]:
            parts.append(Text(f"  note: {n}", style="dim"))
    sw = summary.get("sweep")
    if sw:
        parts.append(Text(f"runs: {sw['runs']} ({sw['ran']} run now, {sw['kept']} kept, {len(sw['failed'])} failed)"
                          f"; stacks started {sw['stack_starts']}, reused {sw['stack_reuses']}; "
                          f"{len(summary['missing'])} cell(s) missing; {sw['wall_s']:.0f} s" +
                          ("; INTERRUPTED: rerun with the same --out to resume" if sw["interrupted"] else "")))
    return Group(*parts)


def _policy_line(pol: dict[str, Any]) -> str:
    if not pol["enabled"]:
        return (f"policy: keep speculation off (no bucket shows a {pol['figure']} gain whose interval lies above 1 "
                f"at the lowest load level: no evidence to enable)")
    lim = pol["enable"].get(f"max_{pol['level_kind']}")
    what = f"{pol['speculator']} ({pol['method']}{', ' + pol['draft'] if pol['draft'] else ''})"
    return (f"policy: {what}; enable above {pol['enable']['min_prompt_tokens']} prompt tokens"
            + (f" and at {pol['level_kind']} <= {lim:g}" if lim is not None else "")
            + "; k per bucket below")


def plot_sweep(summary: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """One PNG per speculator (``speedup-<speculator>.png``): per sampling class, the
    policy figure's speedup against the load level, a line per bucket and k, the bootstrap
    interval as error bars, the break-even line at 1. Returns the files written."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    fig_name = summary["figure"]
    written = []
    for spec in sorted({c["speculator"] for c in summary["cells"]}):
        cells = [c for c in summary["cells"] if c["speculator"] == spec]
        samplings = sorted({c["sampling"] for c in cells})
        fig, axes = plt.subplots(1, len(samplings), figsize=(5.5 * len(samplings), 4), squeeze=False, sharey=True)
        for ax, samp in zip(axes[0], samplings):
            for bucket, k in sorted({(c["bucket"], c["k"]) for c in cells if c["sampling"] == samp}):
                pts = sorted((c["level"], c["speedup"].get(fig_name) or {}) for c in cells
                             if c["sampling"] == samp and c["bucket"] == bucket and c["k"] == k)
                pts = [(x, f) for x, f in pts if f.get("speedup") is not None]
                if not pts:
                    continue
                xs = [x for x, _ in pts]
                ys = [f["speedup"] for _, f in pts]
                err = [[max(0.0, y - (f.get("low") if f.get("low") is not None else y)) for y, (_, f) in zip(ys, pts)],
                       [max(0.0, (f.get("high") if f.get("high") is not None else y) - y) for y, (_, f) in zip(ys, pts)]]
                ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=f"{bucket} k={k}")
            ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
            ax.set_title(f"{spec}, {samp}")
            ax.set_xlabel(summary["level_kind"])
            ax.legend(fontsize=7)
        axes[0][0].set_ylabel(f"{fig_name} speedup (spec vs plain)")
        fig.tight_layout()
        path = d / f"speedup-{spec}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written
