"""bench/peers.py's tables: best of rounds per arm, engines pooled over their two arms.

A ratio between engines divides the pooled figures (the best of both arms' rounds); the
control column divides an engine's second arm by its first, which shows the run's noise.
"""

from __future__ import annotations

import statistics
from typing import Any

PEERS = ("og", "llama")


def _vals(runs: list[dict[str, Any]], key: str, **match: Any) -> list[float]:
    return [float(r[key]) for r in runs if r.get(key) is not None
            and all(r.get(k) == v for k, v in match.items())]


def _best(values: list[float], lowest: bool = False) -> float | None:
    if not values:
        return None
    return min(values) if lowest else max(values)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _fmt(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _single_arm(runs: list[dict[str, Any]], arm: str, n: int
                ) -> list[dict[str, Any]] | None:
    """The decode runs of a single (uncontrolled) arm at prompt length `n`; None when the
    run had no such arm (an older JSON, or a --report of one without it)."""
    found = [r for r in runs if r["kind"] == "decode" and r["arm"] == arm]
    return [r for r in found if r["prompt_len"] == n] if found else None


def _decode(runs: list[dict[str, Any]], lens: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    print("\n| prompt | decode tok/s ours / og / llama.cpp | ours/og | ours/llama | "
          "prefill tok/s ours / og / llama.cpp | ours/og | ours/llama | "
          "control arm2/arm1 decode (ours, og, llama) | first TTFT ms ours / og / llama |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in lens:
        row: dict[str, Any] = {}
        for eng in ("ours", "og", "llama"):
            arms = (eng, eng + "2")
            pooled = [r for r in runs if r["kind"] == "decode" and r["prompt_len"] == n
                      and r["arm"] in arms]
            row[eng] = {
                "decode_tok_s": _best(_vals(pooled, "decode_tok_s")),
                "prefill_tok_s": _best(_vals(pooled, "prefill_tok_s")),
                "first_ttft_ms": _best(_vals(pooled, "first_ttft_ms"), lowest=True),
                "peak_rss_mib": _best(_vals(pooled, "peak_rss_mib"), lowest=True),
                "idle_cpu": statistics.median(_vals(pooled, "idle_cpu") or [0.0]),
                "control_decode": _ratio(
                    _best(_vals(runs, "decode_tok_s", kind="decode", prompt_len=n,
                                arm=arms[1])),
                    _best(_vals(runs, "decode_tok_s", kind="decode", prompt_len=n,
                                arm=arms[0]))),
                "control_prefill": _ratio(
                    _best(_vals(runs, "prefill_tok_s", kind="decode", prompt_len=n,
                                arm=arms[1])),
                    _best(_vals(runs, "prefill_tok_s", kind="decode", prompt_len=n,
                                arm=arms[0])))}
        for metric in ("decode_tok_s", "prefill_tok_s"):
            for peer in PEERS:
                row[f"{metric}_ours/{peer}"] = _ratio(row["ours"][metric], row[peer][metric])
        out[str(n)] = row
        d = [row[e]["decode_tok_s"] for e in ("ours", "og", "llama")]
        pf = [row[e]["prefill_tok_s"] for e in ("ours", "og", "llama")]
        print(f"| {n} | {' / '.join(map(_fmt, d))} | {_fmt(row['decode_tok_s_ours/og'], 2)} | "
              f"{_fmt(row['decode_tok_s_ours/llama'], 2)} | {' / '.join(map(_fmt, pf))} | "
              f"{_fmt(row['prefill_tok_s_ours/og'], 2)} | "
              f"{_fmt(row['prefill_tok_s_ours/llama'], 2)} | "
              + ", ".join(_fmt(row[e]["control_decode"], 3) for e in ("ours", "og", "llama"))
              + " | " + " / ".join(_fmt(row[e]["first_ttft_ms"]) for e in ("ours", "og", "llama"))
              + " |")
    if _single_arm(runs, "ours-rows", lens[0]) is not None:
        print("\n| prompt | prefill tok/s ours (last row's logits) / ours-rows (every row's, "
              "as exported) | ratio | first TTFT ms ours / ours-rows |")
        print("|---|---|---|---|")
        for n in lens:
            alone = _single_arm(runs, "ours-rows", n) or []
            rows_pf = _best(_vals(alone, "prefill_tok_s"))
            ttft = _best(_vals(alone, "first_ttft_ms"), lowest=True)
            row = out[str(n)]
            row["ours-rows"] = {"prefill_tok_s": rows_pf, "first_ttft_ms": ttft}
            row["prefill_tok_s_ours/ours-rows"] = _ratio(row["ours"]["prefill_tok_s"], rows_pf)
            print(f"| {n} | {_fmt(row['ours']['prefill_tok_s'])} / {_fmt(rows_pf)} | "
                  f"{_fmt(row['prefill_tok_s_ours/ours-rows'], 2)} | "
                  f"{_fmt(row['ours']['first_ttft_ms'])} / {_fmt(ttft)} |")
    if _single_arm(runs, "og-spin", lens[0]) is not None:
        from engine.config import SPIN_US  # what bench._peer_workers gave og-spin

        print("\n| prompt | decode tok/s ours / og (ONNX Runtime's spin) / og-spin (our "
              f"{SPIN_US} µs spin) | ours/og-spin | og-spin/og |")
        print("|---|---|---|---|")
        for n in lens:
            spun = _best(_vals(_single_arm(runs, "og-spin", n) or [], "decode_tok_s"))
            row = out[str(n)]
            row["og-spin"] = {"decode_tok_s": spun}
            row["decode_tok_s_ours/og-spin"] = _ratio(row["ours"]["decode_tok_s"], spun)
            row["decode_tok_s_og-spin/og"] = _ratio(spun, row["og"]["decode_tok_s"])
            print(f"| {n} | {_fmt(row['ours']['decode_tok_s'])} / "
                  f"{_fmt(row['og']['decode_tok_s'])} / {_fmt(spun)} | "
                  f"{_fmt(row['decode_tok_s_ours/og-spin'], 2)} | "
                  f"{_fmt(row['decode_tok_s_og-spin/og'], 2)} |")
    if _single_arm(runs, "ours-gqa", lens[0]) is not None:
        print("\n| prompt | decode tok/s ours (engine/kernels' attention) / ours-gqa (ONNX "
              "Runtime's GroupQueryAttention) | ratio |")
        print("|---|---|---|")
        for n in lens:
            plain = _best(_vals(_single_arm(runs, "ours-gqa", n) or [], "decode_tok_s"))
            row = out[str(n)]
            row["ours-gqa"] = {"decode_tok_s": plain}
            row["decode_tok_s_ours/ours-gqa"] = _ratio(row["ours"]["decode_tok_s"], plain)
            print(f"| {n} | {_fmt(row['ours']['decode_tok_s'])} / {_fmt(plain)} | "
                  f"{_fmt(row['decode_tok_s_ours/ours-gqa'], 2)} |")
    print("\n| prompt | peak RSS MiB ours / og / llama.cpp | idle CPU s/s (median) |")
    print("|---|---|---|")
    for n in lens:
        row = out[str(n)]
        print(f"| {n} | " + " / ".join(_fmt(row[e]["peak_rss_mib"]) for e in
                                        ("ours", "og", "llama"))
              + " | " + " / ".join(_fmt(row[e]["idle_cpu"], 3) for e in
                                   ("ours", "og", "llama")) + " |")
    return out


def _first(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per prompt length: each arm's best TTFT (and median), best decode and load, then
    ours (``first``/``first2`` pooled) over onnxruntime-genai and llama.cpp."""
    out: dict[str, Any] = {}
    print("\n| first request after a load | prompt | TTFT ms best (median) | decode tok/s "
          "best | load ms best |")
    print("|---|---|---|---|---|")
    lens = sorted({int(r["prompt_len"]) for r in runs if r.get("kind") == "first"})
    for n in lens:
        rows: dict[str, Any] = {}
        for arm in ("first", "first2", "first-4k", "first-cli", "first-og", "first-llama"):
            ttft = _vals(runs, "ttft_ms", kind="first", arm=arm, prompt_len=n)
            if not ttft:
                continue
            rows[arm] = {"ttft_ms": min(ttft), "ttft_median_ms": statistics.median(ttft),
                         "decode_tok_s": _best(_vals(runs, "decode_tok_s", kind="first",
                                                     arm=arm, prompt_len=n)),
                         "load_ms": _best(_vals(runs, "load_ms", kind="first", arm=arm,
                                                prompt_len=n), True)}
            row = rows[arm]
            print(f"| {arm} | {n} | {_fmt(row['ttft_ms'])} ({_fmt(row['ttft_median_ms'])}) | "
                  f"{_fmt(row['decode_tok_s'])} | {_fmt(row['load_ms'])} |")
        out[str(n)] = rows
    print("\n| first request | prompt | decode ours/og | decode ours/llama.cpp | CLI/og | "
          "CLI/llama.cpp | TTFT og/ours | TTFT llama.cpp/ours |")
    print("|---|---|---|---|---|---|---|---|")
    for n in lens:
        rows = out[str(n)]
        ours = [r for a in ("first", "first2") if (r := rows.get(a))]
        if not ours:
            continue
        decode = max(r["decode_tok_s"] for r in ours if r["decode_tok_s"] is not None)
        ttft = min(r["ttft_ms"] for r in ours)
        cli = rows.get("first-cli", {}).get("decode_tok_s")
        cells = []
        for num, peer in ((decode, "first-og"), (decode, "first-llama"), (cli, "first-og"),
                          (cli, "first-llama")):
            other = rows.get(peer, {}).get("decode_tok_s")
            cells.append(_fmt(num / other, 2) if num and other else "-")
        for peer in ("first-og", "first-llama"):
            other = rows.get(peer, {}).get("ttft_ms")
            cells.append(_fmt(other / ttft, 2) if other else "-")
        rows["ratios"] = dict(zip(("decode_og", "decode_llama", "cli_og", "cli_llama",
                                   "ttft_og", "ttft_llama"), cells, strict=True))
        print(f"| | {n} | " + " | ".join(cells) + " |")
    return out


def _fim(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for eng in ("ours", "og", "llama", "ours-gqa"):
        # ours-gqa: a single arm (no control), ONNX Runtime's attention kernel
        names = (eng,) if eng == "ours-gqa" else (eng, eng + "2")
        arms: dict[str, list[list[float]]] = {a: [] for a in names}
        recomputed: list[int] = []
        for r in runs:
            if r["kind"] == "fim" and r["arm"] in arms:
                arms[r["arm"]].append([row["ttft_ms"] for row in r["rows"]])
                recomputed = [row["recomputed"] for row in r["rows"]]
        if not any(arms.values()):
            continue
        def per_edit(series: list[list[float]]) -> list[float]:
            return [min(col) for col in zip(*series, strict=True)]
        pooled = per_edit([s for v in arms.values() for s in v])
        medians = {a: statistics.median(per_edit(v)[1:]) for a, v in arms.items() if v}
        out[eng] = {"cold_ms": pooled[0], "edit_median_ms": statistics.median(pooled[1:]),
                    "recomputed_median": statistics.median(recomputed[1:]),
                    "prompt_tokens": None,
                    "control": _ratio(medians.get(eng + "2"), medians.get(eng))}
    print("\n| FIM after a one-character edit | cold TTFT ms | TTFT ms after an edit (median) "
          "| prompt tokens recomputed (median) | control arm2/arm1 |")
    print("|---|---|---|---|---|")
    for eng, row in out.items():
        print(f"| {eng} | {_fmt(row['cold_ms'])} | {_fmt(row['edit_median_ms'])} | "
              f"{row['recomputed_median']:.0f} | {_fmt(row['control'], 3)} |")
    for peer in (*PEERS, "ours-gqa"):
        if peer in out and "ours" in out:
            out[f"{peer}/ours"] = _ratio(out[peer]["edit_median_ms"],
                                         out["ours"]["edit_median_ms"])
            print(f"- TTFT after an edit, {peer} / ours: {_fmt(out[f'{peer}/ours'], 2)}x")
    return out


def _streams(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Two windows: ``steady`` once every stream has its first token (og's static batch
    counts from there), ``e2e`` from the submission to the last token (the prompts'
    prefill included: ours runs them one by one while the first stream decodes)."""
    out: dict[str, Any] = {}
    for eng in ("ours", "og", "llama"):
        pooled = [r for r in runs if r["kind"] == "streams" and r["arm"] in (eng, eng + "2")]
        if pooled:
            row = {key: _best(_vals(pooled, key)) for key in
                   ("one_tok_s", "many_tok_s", "one_e2e_tok_s", "many_e2e_tok_s")}
            row["scaling"] = _ratio(row["many_tok_s"], row["one_tok_s"])
            out[eng] = row
    out["control_ours"] = _ratio(_best(_vals(runs, "many_tok_s", kind="streams", arm="ours2")),
                                 _best(_vals(runs, "many_tok_s", kind="streams", arm="ours")))
    print("\n| 4 streams | one stream tok/s steady (end to end) | 4 streams aggregate tok/s "
          "steady (end to end) | 4 / 1 steady |")
    print("|---|---|---|---|")
    for eng in ("ours", "og", "llama"):
        if eng in out:
            row = out[eng]
            print(f"| {eng} | {_fmt(row['one_tok_s'])} ({_fmt(row['one_e2e_tok_s'])}) | "
                  f"{_fmt(row['many_tok_s'])} ({_fmt(row['many_e2e_tok_s'])}) | "
                  f"{_fmt(row['scaling'], 2)} |")
    for peer in PEERS:
        if peer in out and "ours" in out:
            out[f"ours/{peer}"] = _ratio(out["ours"]["many_tok_s"], out[peer]["many_tok_s"])
            out[f"ours/{peer} e2e"] = _ratio(out["ours"]["many_e2e_tok_s"],
                                             out[peer]["many_e2e_tok_s"])
            print(f"- 4-stream aggregate ours / {peer}: steady "
                  f"{_fmt(out[f'ours/{peer}'], 2)}x, end to end "
                  f"{_fmt(out[f'ours/{peer} e2e'], 2)}x")
    print(f"- control ours2/ours (4 streams): {_fmt(out['control_ours'], 3)}")
    return out


def _spec(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    print("\n| spec task | tok/s median (best) plain / plain2 / lookup / og / llama.cpp / "
          "llama.cpp lookup | lookup/plain | lookup/og | lookup/llama.cpp lookup | "
          "accepted/proposed |")
    print("|---|---|---|---|---|---|")
    for task in ("edit", "novel"):
        row: dict[str, Any] = {}
        for arm in ("plain", "plain2", "lookup", "og", "llama", "llama-lookup"):
            vals = _vals(runs, "decode_tok_s", kind="spec", task=task, arm=arm)
            if vals:
                row[arm] = {"median": statistics.median(vals), "best": max(vals)}
        if not row:
            continue
        spec = next((r.get("speculation") for r in runs if r["kind"] == "spec"
                     and r["task"] == task and r["arm"] == "lookup" and r.get("speculation")),
                    None) or {}
        pooled_plain = statistics.median(
            _vals(runs, "decode_tok_s", kind="spec", task=task, arm="plain")
            + _vals(runs, "decode_tok_s", kind="spec", task=task, arm="plain2"))
        med = {a: v["median"] for a, v in row.items()}
        row["lookup/plain"] = _ratio(med.get("lookup"), pooled_plain)
        row["lookup/og"] = _ratio(med.get("lookup"), med.get("og"))
        row["lookup/llama-lookup"] = _ratio(med.get("lookup"), med.get("llama-lookup"))
        row["speculation"] = spec
        out[task] = row
        cells = " / ".join(f"{_fmt(row[a]['median'])} ({_fmt(row[a]['best'])})" if a in row
                           else "—" for a in ("plain", "plain2", "lookup", "og", "llama",
                                              "llama-lookup"))
        print(f"| {task} | {cells} | {_fmt(row['lookup/plain'], 2)} | "
              f"{_fmt(row['lookup/og'], 2)} | {_fmt(row['lookup/llama-lookup'], 2)} | "
              f"{spec.get('accepted', '—')}/{spec.get('proposed', '—')} |")
    return out


def report(runs: list[dict[str, Any]], machine: dict[str, Any], workloads: list[str],
           lens: list[int]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    if "decode" in workloads:
        summary["decode"] = _decode(runs, lens)
        rates = {e: summary["decode"][str(lens[0])][e]["decode_tok_s"]
                 for e in ("ours", "og", "llama")}
        per_token = {"ours": machine["onnx_per_token"], "og": machine["onnx_per_token"],
                     "llama": machine["gguf"]}
        achieved = {e: (rates[e] or 0) * per_token[e] / 1e9 for e in rates}
        summary["achieved_gb_s"] = achieved
        print(f"\nread bandwidth: numpy copy {machine['memcpy_read_gb_s']:.1f} GB/s (1 thread)"
              f", ORT ReduceSum {machine['ort_2t_read_gb_s']:.1f} GB/s (2 threads); decode at "
              f"{lens[0]} tokens x bytes read per token (ours/og {per_token['ours'] / 1e6:.0f}"
              f" MB, llama.cpp {per_token['llama'] / 1e6:.0f} MB): "
              + ", ".join(f"{e} {v:.1f} GB/s" for e, v in achieved.items()))
    if "first" in workloads:
        summary["first"] = _first(runs)
    if "fim" in workloads:
        summary["fim"] = _fim(runs)
    if "streams" in workloads:
        summary["streams"] = _streams(runs)
    if "spec" in workloads:
        summary["spec"] = _spec(runs)
    loads = [r["loadavg"][0] for r in runs if r.get("loadavg")]
    if loads:
        summary["loadavg_1m"] = {"min": min(loads), "median": statistics.median(loads),
                                 "max": max(loads)}
        print(f"\n1-minute load average before each job: min {min(loads):.2f}, median "
              f"{statistics.median(loads):.2f}, max {max(loads):.2f}")
    return summary
