"""Client of the out-of-process scorer (margrpo.rewards.server), behind the usual reward
interface, so the trainer and evaluator cannot tell a remote backend from a local one.

params.yaml, either form:
    rewards:
      - {name: imagereward, weight: 1.0, python: .venvs/legacy/bin/python,
         checkpoint: /w/ImageReward.pt, med_config: /w/med_config.json}
      - {name: remote, backend: hpsv2, url: "http://127.0.0.1:8765", weight: 0.5}

`python`: the interpreter of the backend's env; the client starts `serve` there on a free
loopback port, waits until the model has loaded, and stops it at exit. `url`: a server
already running. Every other key goes to the backend in the server process.

No lost work: each batch is written as PNGs + prompts.jsonl under `workdir`; when the
server is unreachable, crashed or failing, the batch stays on disk and the error names the
folder, the server log, and the one-shot command that scores it by hand.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import torch

import margrpo
from margrpo.jsonl import write_jsonl
from margrpo.rewards.clip_common import check_batch, require_paths, to_pil
from margrpo.rewards.table import CLIENT_KEYS

ENV_HINT = "scripts/setup_backend_env.sh legacy (or openclip), then set rewards[].python"


class RemoteScorerError(RuntimeError):
    pass


class RemoteReward:
    def __init__(self, backend: str, backend_kwargs: dict[str, Any] | None = None, *,
                 python: str | None = None, url: str | None = None, workdir: str | None = None,
                 startup_timeout: float = 900, request_timeout: float = 3600,
                 keep_batches: bool = False, plugins: list[str] | None = None,
                 pythonpath: list[str] | None = None):
        if not (python or url):
            raise ValueError(f"remote reward {backend!r}: set rewards[].python or rewards[].url")
        self.name = backend
        self.backend, self.kwargs = backend, dict(backend_kwargs or {})
        self.request_timeout, self.keep_batches = float(request_timeout), bool(keep_batches)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"margrpo-{backend}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / "server.log"
        self.python = python
        self.plugins = list(plugins or [])
        if url:
            self.url = url.rstrip("/")
            self._health(f"no scorer answers at {self.url} (rewards[].url)")
        else:
            py = require_paths(backend, ENV_HINT, python=python)["python"]
            self.url = self._start(py, startup_timeout, list(pythonpath or []))
        atexit.register(self.close)

    def _server_cmd(self, python: str | os.PathLike, *args: str) -> list[str]:
        cmd = [str(python), "-m", "margrpo.rewards.server", *args, "--backend", self.backend,
               "--kwargs", json.dumps(self.kwargs)]
        for mod in self.plugins:
            cmd += ["--plugin", mod]
        return cmd

    def _start(self, python: Path, timeout: float, pythonpath: list[str]) -> str:
        port_file = self.workdir / f"port-{uuid.uuid4().hex}.json"
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        # The backend env may lack an install of margrpo: put this checkout's src first.
        src = str(Path(margrpo.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join([src, *pythonpath, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        cmd = self._server_cmd(python, "serve", "--port", "0", "--port-file", str(port_file))
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.time() + timeout
        while not port_file.exists():
            if self.proc.poll() is not None:
                raise RemoteScorerError(
                    f"scorer {self.backend!r} exited with code {self.proc.returncode} while "
                    f"starting ({python}); its log {self.log_path} ends with:\n{self._log_tail()}"
                )
            if time.time() > deadline:
                self.close()
                raise RemoteScorerError(f"scorer {self.backend!r} not ready after {timeout:.0f}s; "
                                        f"log: {self.log_path}")
            time.sleep(0.1)
        info = json.loads(port_file.read_text())
        host = f"[{info['host']}]" if ":" in info["host"] else info["host"]
        return f"http://{host}:{info['port']}"

    def _log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"

    def _request(self, path: str, body: dict | None, timeout: float) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise RemoteScorerError(f"scorer {self.backend!r} at {self.url} failed: {detail}") from exc

    def _health(self, what: str) -> dict:
        try:
            return self._request("/health", None, 10)
        except (OSError, urllib.error.URLError) as exc:
            raise RemoteScorerError(f"{what}: {exc}") from exc

    def _write_batch(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> Path:
        batch = self.workdir / "batches" / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
        batch.mkdir(parents=True)
        # PNG is 8-bit: the scorer sees the images quantised to uint8, as a saved sample is.
        rows = []
        for i, (img, p, m) in enumerate(zip(to_pil(images), prompts, metadata)):
            img.save(batch / f"{i:06d}.png")
            rows.append({"image": f"{i:06d}.png", "prompt": p, "metadata": m})
        write_jsonl(rows, batch / "prompts.jsonl")
        return batch

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
        check_batch(images, prompts)
        batch = self._write_batch(images, list(prompts), list(metadata))
        body = {"image_dir": str(batch), "prompts": str(batch / "prompts.jsonl"),
                "out": str(batch / "scores.jsonl")}
        try:
            scores = self._request("/score", body, self.request_timeout)["scores"]
        except (OSError, urllib.error.URLError, RemoteScorerError) as exc:
            raise RemoteScorerError(self._failure_message(exc, batch)) from exc
        if len(scores) != images.shape[0]:
            raise RemoteScorerError(f"scorer returned {len(scores)} scores for "
                                    f"{images.shape[0]} images; batch kept at {batch}")
        if not self.keep_batches:
            shutil.rmtree(batch, ignore_errors=True)
        return torch.tensor(scores, dtype=torch.float32)

    def _failure_message(self, exc: Exception, batch: Path) -> str:
        msg = [f"scorer {self.backend!r} at {self.url} did not score the batch ({exc})."]
        if self.proc is not None and self.proc.poll() is not None:
            msg.append(f"The server process exited with code {self.proc.returncode}; "
                       f"log {self.log_path}:\n{self._log_tail()}")
        py = self.python or "<backend env python>"
        cmd = " ".join(repr(c) if " " in c or "{" in c else c for c in self._server_cmd(
            py, "score", "--images", str(batch), "--prompts", str(batch / "prompts.jsonl"),
            "--out", str(batch / "scores.jsonl")))
        msg.append(f"Nothing is lost: the batch ({len(list(batch.glob('*.png')))} PNGs + "
                   f"prompts.jsonl) is kept at {batch}. Score it by hand with:\n  {cmd}")
        return "\n".join(msg)

    def close(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self._request("/shutdown", {}, 5)
            self.proc.wait(timeout=10)
        except Exception:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def split_client_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    client = {k: kwargs[k] for k in CLIENT_KEYS if k in kwargs}
    backend = {k: v for k, v in kwargs.items() if k not in CLIENT_KEYS}
    return client, backend


def maybe_remote(backend: str, kwargs: dict[str, Any]) -> RemoteReward | None:
    """A RemoteReward when the backend's params name an env (`python`) or a server (`url`)."""
    if kwargs.get("python") or kwargs.get("url"):
        client, rest = split_client_kwargs(kwargs)
        return RemoteReward(backend, rest, **client)
    return None


def build(backend: str, **kwargs: Any) -> RemoteReward:
    """Table entry "remote": `backend` runs in the server process; client keys stay here."""
    client, rest = split_client_kwargs(kwargs)
    return RemoteReward(backend, rest, **client)
