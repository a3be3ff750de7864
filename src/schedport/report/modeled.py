"""The modeled-source banner's fidelity table: the modeled BurstGPT held against real BurstGPT rows.

`modeled_check_html` renders, for each modeled source whose corpus manifest recorded a fidelity
check (`schedport.workload.modelcheck`, carried into ``portability.json`` under
``workload.corpus_sources.<source>.fidelity``), a small table (KS distance per model and length,
rank correlations and shares against the real rows' bootstrap intervals) and the verdict
"matches / does not match" under the check's stated rule. Nothing is shown when no check was
recorded, and a check that could not run says why.
"""

from __future__ import annotations

from schedport.report.style import escape_html as esc


def _f(v, nd: int = 3) -> str:
    return "n/a" if v is None else f"{v:.{nd}f}"


def _q(v) -> str:
    return "/".join("n/a" if x is None else f"{x:.0f}" for x in (v or []))


def _one(source: str, fid: dict) -> str:
    if not fid.get("available"):
        return f"<p class='sub'>{esc(source)}: {esc(fid.get('note', 'no fidelity check recorded'))}</p>"
    real = fid.get("real", {})
    rows = "".join(
        f"<tr><td class='l'>{esc(c['model'])}</td><td class='l'>{esc(c['length'])}</td><td>{c['n_real']}</td>"
        f"<td>{esc(_q(c['real_q']))}</td><td>{esc(_q(c['modeled_q']))}</td><td>{_f(c['ks'])}</td>"
        f"<td>&lt; {_f(c['bound'])}</td><td>{'yes' if c['ok'] else '<b>no</b>'}</td></tr>"
        for c in fid.get("lengths", []))
    irows = "".join(
        f"<tr><td class='l'>{esc(c['name'])} ({esc(c['model'])})</td><td>{_f(c['real'])}</td>"
        f"<td>[{_f(c['lo'])}, {_f(c['hi'])}]</td><td>{_f(c['modeled'])}</td>"
        f"<td>{'yes' if c['ok'] else '<b>no</b>'}</td></tr>" for c in fid.get("intervals", []))
    files = ", ".join(esc(f.get("name", "")) for f in real.get("files", []))
    verdict = esc(fid.get("verdict", "n/a"))
    return (f"<p><b>{esc(source)}</b> vs real BurstGPT rows ({files}: {real.get('conversation_kept', 'n/a')} "
            f"Conversation rows with tokens): <b>{verdict}</b>.</p>"
            "<table><tr><th class='l'>model</th><th class='l'>tokens</th><th>real n</th>"
            "<th>real p10/p50/p90/p99</th><th>modeled p10/p50/p90/p99</th><th>KS</th><th>bound</th><th>ok</th></tr>"
            f"{rows}</table>"
            "<table><tr><th class='l'>statistic</th><th>real</th><th>95% bootstrap</th><th>modeled</th><th>ok</th></tr>"
            f"{irows}</table>"
            f"<p class='sub'>Rule: {esc(fid.get('rule', ''))}. {' '.join(esc(n) for n in fid.get('notes', []))}</p>")


def modeled_check_html(res: dict) -> str:
    """HTML fragment for the modeled-source banner: each modeled source's fidelity table and verdict ("" if none)."""
    srcs = ((res.get("workload") or {}).get("corpus_sources") or {})
    checks = {name: v["fidelity"] for name, v in srcs.items()
              if isinstance(v, dict) and v.get("modeled") and isinstance(v.get("fidelity"), dict)}
    if not checks:
        return ""
    verdicts = "; ".join(f"{name}: {fid.get('verdict', 'not run') if fid.get('available') else 'not run'}"
                         for name, fid in checks.items())
    return ("<details class='modeled'><summary>Fidelity check, the modeled Conversation stream vs real BurstGPT "
            f"rows: {esc(verdicts)}</summary>{''.join(_one(n, f) for n, f in checks.items())}</details>")
