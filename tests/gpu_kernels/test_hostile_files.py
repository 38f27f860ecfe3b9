"""Hostile files: each ends as an output or a dead letter with the right
code within a CPU-time and RSS bound, and no message echoes the payload.

Each file is decoded in a fresh subprocess, after a warm-up decode of a small image of the same
format (libraries and the DALI pipeline loaded). CPU time: ``resource.getrusage`` around the
hostile decode. Peak RSS: ``VmHWM`` after resetting the peak with ``/proc/self/clear_refs``
(``ru_maxrss`` cannot be reset, and after fork + exec it starts at the parent's — pytest's —
peak, because Linux carries ``signal->maxrss`` across exec).

Bounds: a dead letter costs at most 64 MiB over the warmed-up process; an output at most its
header's ``decoded_nbytes`` + 64 MiB (so the batcher's estimate is honest); any file at most
5 s of CPU (refusing the 100 000-scan JPEG takes milliseconds; decoding it took 18 s of CPU).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_kernels.codec import DaliDecoder, sniff
from schemas.errors import LightboxError
from tests.corpus import Hostile, hostile_files

ROOT = Path(__file__).resolve().parents[2]
CPU_BOUND_S = 5.0
SLACK = 64 << 20

CHILD = r"""
import io, json, resource, sys
import numpy as np
from PIL import Image
from gpu_kernels.codec import DaliDecoder, sniff
blob = open(sys.argv[1], "rb").read()
fmt = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP", "tif": "TIFF", "bmp": "BMP", "gif": "GIF",
       "heic": "HEIF", "avif": "AVIF"}[sys.argv[1].rsplit(".", 1)[1]]
if fmt == "HEIF":
    import pillow_heif
    pillow_heif.register_heif_opener()
dec = DaliDecoder("cpu")
warm = io.BytesIO()
Image.new("RGB", (32, 32), (10, 120, 230)).save(warm, fmt)
assert isinstance(dec.decode_batch([warm.getvalue()])[0], np.ndarray)
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
def hwm():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
open("/proc/self/clear_refs", "w").write("5")  # peak RSS := current RSS
current = hwm()
cpu0 = cpu()
(result,) = dec.decode_batch([blob])
cpu1, peak = cpu(), hwm()
try:
    estimate = sniff(blob).decoded_nbytes
except Exception:
    estimate = None
ok = isinstance(result, np.ndarray)
print(json.dumps({"outcome": "output" if ok else result.code.value, "message": None if ok else str(result),
                  "cpu_s": cpu1 - cpu0, "rss_over": peak - current, "estimate": estimate}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("case", hostile_files(), ids=lambda h: h.name)
def test_hostile_file_ends_within_bounds(case: Hostile, tmp_path: Path) -> None:
    blob = case.make()
    path = tmp_path / case.name
    path.write_bytes(blob)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["outcome"] == case.outcome, got
    assert got["cpu_s"] < CPU_BOUND_S, got
    bound = SLACK + (got["estimate"] if got["outcome"] == "output" else 0)
    assert got["rss_over"] <= bound, got
    if got["message"] is not None:
        _assert_no_echo(blob, got["message"])


# ---- messages never echo payload bytes --------------------------------------------------------


def _assert_no_echo(blob: bytes, message: str, window: int = 8) -> None:
    """No ``window``-byte run of the payload appears in the message, as text or as hex."""
    text = message.encode("latin-1", "replace")
    lowered = re.sub(r"sha256 [0-9a-f]{12}", "", message.lower())
    # Hex-looking runs (``deadbeef``, ``de ad be ef``); plain decimal numbers (sizes) are not hex dumps.
    runs = [m.group(0) for m in re.finditer(r"(?:[0-9a-f]{2}[ :]?){4,}", lowered)]
    compact_hex = " ".join(re.sub(r"[ :]", "", r) for r in runs if not r.strip().isdigit())
    for i in range(0, max(len(blob) - window + 1, 0)):
        chunk = blob[i : i + window]
        assert chunk not in text, (chunk, message)
        assert chunk.hex() not in compact_hex, (chunk, message)


LEAKS = {
    "passwd": b"root:*:0:0:System Administrator:/var/root:/bin/sh\nnobody:*:-2:-2::0:0:Unprivileged:/:/bin/false\n",
    "shadow": b"root:$6$saltsalt$hashhashhashhashhashhash:19000:0:99999:7:::\n",
    "environ": b"AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG\x00HOME=/root\x00PATH=/usr/bin\x00",
    "hexish": bytes.fromhex("deadbeefcafebabe0123456789abcdef" * 8),
    "html": b"<!DOCTYPE html><html><body>403 Forbidden: token=abcdef123456</body></html>",
    "json": b'{"password": "hunter2hunter2", "user": "admin"}',
    "pem": b"-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n",
}


@pytest.mark.parametrize("name", sorted(LEAKS))
def test_dead_letters_name_type_size_and_digest_never_content(name: str) -> None:
    blob = LEAKS[name]
    with DaliDecoder("cpu") as d:
        (err,) = d.decode_batch([blob])
    assert isinstance(err, LightboxError) and err.code.value == "UNSUPPORTED_FORMAT"
    assert f"{len(blob)} bytes" in err.message and re.search(r"sha256 [0-9a-f]{12}", err.message)
    _assert_no_echo(blob, str(err))
    for secret in ("root", "hunter2", "wJalr", "token", "BEGIN", "deadbeef", "de ad be ef"):
        assert secret not in str(err)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=8, max_size=512))
def test_no_sniff_message_echoes_random_payloads(blob: bytes) -> None:
    try:
        sniff(blob)
    except LightboxError as err:
        _assert_no_echo(blob, str(err))


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"RIFF\x00\x00\x00\x00WEBP", b"II*\x00", b"MM\x00*",
                        b"BM", b"GIF89a", b"\x00\x00\x00\x18ftypheic", b"\x00\x00\x00\x18ftypavif"]),
       st.binary(min_size=8, max_size=256))
def test_no_message_echoes_a_broken_image_header(magic: bytes, tail: bytes) -> None:
    blob = magic + tail
    try:
        sniff(blob)
    except LightboxError as err:
        _assert_no_echo(tail, str(err))
