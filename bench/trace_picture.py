#!/usr/bin/env python3
"""Draws a generate --trace file (Chrome trace-event JSON) as a timeline picture in SVG.

    python3 bench/trace_picture.py TRACE.json OUT.svg [--title TEXT] [--width PIXELS] [--from-ms A --to-ms B]

One row per rank and stream (the trace's pid/tid, named by its "M" metadata events), time left to right in
milliseconds, one box per complete ("X") event: compute boxes coloured by microbatch, transfers, host work and
checkpoints each in their own colour, names written inside the boxes wide enough to hold them. Nested spans of a
row are drawn as thinner boxes inside their parent. Plain Python: no plotting library needed.
"""
import argparse
import html
import json
import re
import sys

ROW_HEIGHT = 26
LABEL_WIDTH = 330
TOP = 58
PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f"]
TRACK_COLOURS = {1: "#8c8c8c", 3: "#e15759", 4: "#76b7b2", 5: "#b07aa1"}


def load(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        sys.exit(f"{path}: no traceEvents list")
    return doc, events


def names(events):
    processes, threads = {}, {}
    for e in events:
        if e.get("ph") != "M":
            continue
        if e.get("name") == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        elif e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    return processes, threads


def colour(event):
    match = re.search(r"\bmb (\d+)", event["name"])
    if event.get("tid") == 2 and match:
        return PALETTE[int(match.group(1)) % len(PALETTE)]
    if event["name"].startswith("decode"):
        return "#59a14f"
    return TRACK_COLOURS.get(event.get("tid"), "#bab0ac")


def nice_step(span_ms, ticks=10):
    raw = span_ms / ticks
    magnitude = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1
    for factor in (1, 2, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def draw(doc, events, title, width, start_ms, end_ms):
    processes, threads = names(events)
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        sys.exit("the trace has no complete (X) events to draw")
    rows = sorted({(e["pid"], e["tid"]) for e in spans})
    first = min(e["ts"] for e in spans) / 1000.0 if start_ms is None else start_ms
    last = max(e["ts"] + e["dur"] for e in spans) / 1000.0 if end_ms is None else end_ms
    scale = (width - LABEL_WIDTH - 20) / max(last - first, 1e-6)
    height = TOP + ROW_HEIGHT * len(rows) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="Helvetica, Arial, sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="20" font-size="15" font-weight="bold">{html.escape(title)}</text>']
    other = doc.get("otherData", {}) if isinstance(doc, dict) else {}
    if other.get("request"):
        out.append(f'<text x="10" y="38" fill="#555">{html.escape(str(other["request"])[:190])}</text>')
    step = nice_step(last - first)
    tick = (first // step) * step
    while tick <= last:
        if tick >= first:
            x = LABEL_WIDTH + (tick - first) * scale
            out.append(f'<line x1="{x:.1f}" y1="{TOP - 6}" x2="{x:.1f}" y2="{TOP + ROW_HEIGHT * len(rows)}" '
                       f'stroke="#e5e5e5"/>')
            out.append(f'<text x="{x:.1f}" y="{TOP + ROW_HEIGHT * len(rows) + 16}" text-anchor="middle" '
                       f'fill="#555">{tick:g} ms</text>')
        tick += step
    previous_pid = None
    for index, (pid, tid) in enumerate(rows):
        y = TOP + index * ROW_HEIGHT
        if pid != previous_pid:
            out.append(f'<line x1="0" y1="{y}" x2="{width}" y2="{y}" stroke="#999"/>')
            previous_pid = pid
        label = f'{processes.get(pid, f"pid {pid}")}: {threads.get((pid, tid), f"tid {tid}")}'
        out.append(f'<text x="6" y="{y + ROW_HEIGHT * 0.65:.1f}">{html.escape(label[:58])}</text>')
        row = sorted((e for e in spans if (e["pid"], e["tid"]) == (pid, tid)), key=lambda e: (e["ts"], -e["dur"]))
        open_ends = []  # ends of the spans enclosing the current one: its depth
        for e in row:
            begin, end = e["ts"] / 1000.0, (e["ts"] + e["dur"]) / 1000.0
            while open_ends and open_ends[-1] <= e["ts"]:
                open_ends.pop()
            depth = len(open_ends)
            open_ends.append(e["ts"] + e["dur"])
            if end < first or begin > last:
                continue
            x = LABEL_WIDTH + (max(begin, first) - first) * scale
            w = max((min(end, last) - max(begin, first)) * scale, 0.8)
            inset = min(depth * 4, ROW_HEIGHT / 2 - 3)
            box_y, box_h = y + 3 + inset, ROW_HEIGHT - 6 - 2 * inset
            name = html.escape(e["name"])
            out.append(f'<rect x="{x:.2f}" y="{box_y:.1f}" width="{w:.2f}" height="{box_h:.1f}" fill="{colour(e)}" '
                       f'stroke="white" stroke-width="0.5"><title>{name}: {e["dur"] / 1000.0:.3f} ms</title></rect>')
            if w > 6.2 * len(e["name"]) and depth == 0:
                out.append(f'<text x="{x + 3:.2f}" y="{y + ROW_HEIGHT * 0.65:.1f}" fill="white">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace", help="a generate --trace file")
    parser.add_argument("out", help="the SVG to write (e.g. docs/trace-cpu-3rank.svg)")
    parser.add_argument("--title", default=None)
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--from-ms", type=float, default=None, help="draw from this time (ms) on")
    parser.add_argument("--to-ms", type=float, default=None, help="draw up to this time (ms)")
    args = parser.parse_args()
    doc, events = load(args.trace)
    svg = draw(doc, events, args.title or f"diffpipe trace: {args.trace}", args.width, args.from_ms, args.to_ms)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(svg)
    print(f"wrote {args.out} ({sum(1 for e in events if e.get('ph') == 'X')} spans)")


if __name__ == "__main__":
    main()
