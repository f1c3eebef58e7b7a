"""Out-of-process scoring: a one-shot CLI and a loopback HTTP server, run in the backend's own
virtual environment (image-reward / t2v-metrics cannot share the core's).

Input is a folder of PNGs plus a JSONL of prompts, one row per image:
    {"image": "000000.png", "prompt": "a red cube", "metadata": {...}}
Output is one float per row (higher is better), in row order.

    # one-shot: scores.jsonl gets {"image", "score"} rows
    .venvs/legacy/bin/python -m margrpo.rewards.server score --backend imagereward \
        --kwargs '{"checkpoint": "...", "med_config": "..."}' \
        --images DIR --prompts DIR/prompts.jsonl --out DIR/scores.jsonl
    # server: loads the model once, then answers POST /score {"image_dir", "prompts", "out"}
    .venvs/legacy/bin/python -m margrpo.rewards.server serve --backend imagereward \
        --kwargs '{...}' --port 0 --port-file /tmp/scorer.json

The server binds loopback only, handles one scoring request at a time (the model is not
thread-safe), writes the port file only once the model has loaded, and answers
GET /health and POST /shutdown. margrpo.rewards.remote is its client.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import torch

from margrpo.atomic import write_text
from margrpo.jsonl import read_jsonl, write_jsonl

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def read_rows(prompts_jsonl: str | os.PathLike) -> list[dict[str, Any]]:
    rows = read_jsonl(prompts_jsonl)
    for row in rows:
        row.setdefault("metadata", {})
    return rows


def load_png(path: Path) -> torch.Tensor:
    """PNG -> [3, H, W] float in [0, 1]."""
    from PIL import Image

    arr = np.asarray(Image.open(path).convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).float().div(255)


def score_folder(model, image_dir: str | os.PathLike, prompts_jsonl: str | os.PathLike,
                 chunk: int = 64) -> list[float]:
    """Score every row of `prompts_jsonl`; images of one chunk are stacked when they share a
    size (a size change starts a new chunk), and the backend batches inside each chunk."""
    rows = read_rows(prompts_jsonl)
    image_dir = Path(image_dir)
    scores: list[float] = []
    start = 0
    while start < len(rows):
        first = load_png(image_dir / rows[start]["image"])
        imgs, end = [first], start + 1
        while end < len(rows) and end - start < chunk:
            nxt = load_png(image_dir / rows[end]["image"])
            if nxt.shape != first.shape:
                break
            imgs.append(nxt)
            end += 1
        part = rows[start:end]
        out = model(torch.stack(imgs), [r["prompt"] for r in part], [r["metadata"] for r in part])
        scores.extend(float(s) for s in torch.as_tensor(out).reshape(-1).tolist())
        start = end
    return scores


def write_scores(out: str | os.PathLike, rows: list[dict], scores: list[float]) -> None:
    write_jsonl(({"image": row["image"], "score": s} for row, s in zip(rows, scores)), out)


def build_model(backend: str, kwargs: dict[str, Any], plugins: list[str]):
    for mod in plugins:
        importlib.import_module(mod)
    from margrpo.rewards.base import build_reward

    kwargs = {k: v for k, v in kwargs.items() if k not in ("python", "url")}
    return build_reward(backend, **kwargs)


class _Handler(BaseHTTPRequestHandler):
    server: "ScoringServer"

    def log_message(self, fmt, *args):  # quiet: one line per request to stderr
        sys.stderr.write("scorer: " + (fmt % args) + "\n")

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, {"ok": True, "backend": self.server.backend, "pid": os.getpid()})
        else:
            self._send(404, {"error": f"no route {self.path}"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        try:
            req = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError as exc:
            self._send(400, {"error": f"bad JSON: {exc}"})
            return
        if self.path == "/shutdown":
            self._send(200, {"ok": True})
            threading.Thread(target=self.server.shutdown, daemon=True).start()
            return
        if self.path != "/score":
            self._send(404, {"error": f"no route {self.path}"})
            return
        try:
            t0 = time.time()
            with self.server.lock:
                scores = score_folder(self.server.model, req["image_dir"], req["prompts"])
            if req.get("out"):
                write_scores(req["out"], read_rows(req["prompts"]), scores)
            self._send(200, {"scores": scores, "backend": self.server.backend,
                             "seconds": round(time.time() - t0, 3)})
        except Exception as exc:  # reported to the client, server stays up
            traceback.print_exc()
            self._send(500, {"error": f"{type(exc).__name__}: {exc}"})


class ScoringServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr, model, backend: str):
        super().__init__(addr, _Handler)
        self.model, self.backend, self.lock = model, backend, threading.Lock()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m margrpo.rewards.server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("serve", "score"):
        p = sub.add_parser(name)
        p.add_argument("--backend", required=True, help="registered reward name")
        p.add_argument("--kwargs", default="{}", help="JSON object of the backend's params")
        p.add_argument("--plugin", action="append", default=[],
                       help="module to import first (registers extra backends)")
    serve, score = sub.choices["serve"], sub.choices["score"]
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0: any free port")
    serve.add_argument("--port-file", help="JSON {host, port, pid} written once ready")
    score.add_argument("--images", required=True)
    score.add_argument("--prompts", required=True)
    score.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    model = build_model(args.backend, json.loads(args.kwargs), args.plugin)
    if args.cmd == "score":
        scores = score_folder(model, args.images, args.prompts)
        write_scores(args.out, read_rows(args.prompts), scores)
        print(f"scored {len(scores)} images with {args.backend} -> {args.out}")
        return 0
    if args.host not in LOOPBACK:
        ap.error(f"--host {args.host}: the scorer serves loopback only")
    srv = ScoringServer((args.host, args.port), model, args.backend)
    host, port = srv.server_address[:2]
    if args.port_file:
        write_text(json.dumps({"host": host, "port": port, "pid": os.getpid()}), args.port_file)
    sys.stderr.write(f"scorer: {args.backend} ready on http://{host}:{port}\n")
    sys.stderr.flush()
    try:
        srv.serve_forever()
    finally:
        srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
