#!/usr/bin/env python3
"""vision_e2e.py — pictures in chat through `cellm serve --mmproj`, end to
end with the official `openai` client.

The random-weight Idefics3 fixture (tests/data/vision/idefics3, the one
test_vision.c checks against transformers) is converted here by the cellm
under test ($CELLM_BIN) into its text model and projector, and served with
--mmproj. Its two fixture pictures (tests/data/vision/idefics3-img*.rgb)
are sent as PNG data: URLs in `image_url` content parts:
- an answer comes back, and the prompt has exactly the ids of the
  fixture's processor (62 and 50 tokens: the template laid the picture's
  tiles out as transformers does);
- the same picture again is not encoded again (the server's picture
  cache) and its prompt comes from the prefix cache, with the same answer;
- hostile pictures (test_asan_hostile, also under ASan): a remote URL, a
  data: URL that is not base64 or not a picture type, bad base64, a
  truncated PNG, bytes that are no picture, a PNG of 30000x30000 pixels, a
  part without a URL, and a picture sent to the SmolLM2 server, which has
  no projector: each a 400 with a message, the server healthy after.

Run by ctest (tests/*_e2e.py); by hand:
    CELLM_BIN=build/cellm python3 tests/vision_e2e.py
"""
import base64
import os
import struct
import subprocess
import tempfile
import urllib.request
import zlib

from e2e_common import (HERE, KEY, MODEL_ID, cellm_bin, check, openai, run, start_server,
                        stop_server)

TEST = "vision_e2e"
VISION_ID = "smolvlm-fixture"
DATA = os.path.join(HERE, "data", "vision")
PICTURES = [(0, 96, 60, 62), (1, 20, 70, 50)]  # index, width, height, prompt ids
# The room the server keeps for pictures: a few of the test model's (its
# rows are 64 floats, 256 bytes), not eight at once.
IMAGE_BUDGET = "16K"

state = {}


def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


def png_of(w, h, idat):
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def png(w, h, rgb):
    """A PNG of RGB8 rows (zlib-compressed, no filter)."""
    raw = b"".join(b"\0" + rgb[y * w * 3:(y + 1) * w * 3] for y in range(h))
    return png_of(w, h, zlib.compress(raw))


def picture(i):
    _, w, h, _ = PICTURES[i]
    with open(os.path.join(DATA, f"idefics3-img{i}.rgb"), "rb") as f:
        return png(w, h, f.read())


def data_url(data, kind="image/png"):
    return f"data:{kind};base64," + base64.b64encode(data).decode()


def ask(url, text="Describe this image."):
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


def vision():
    """The fixture's server (started once): (client, base)."""
    if "client" not in state:
        tmp = tempfile.TemporaryDirectory()
        state["tmp"] = tmp
        model = os.path.join(tmp.name, "smolvlm.gguf")
        r = subprocess.run([cellm_bin(TEST), "convert", os.path.join(DATA, "idefics3"), model],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"cellm convert idefics3: {r.stderr.strip()}")
        mmproj = os.path.join(tmp.name, "mmproj-smolvlm.gguf")
        proc, base = start_server(TEST, ["--api-key", KEY, "--alias", VISION_ID, "-c", "512",
                                         "-t", "2", "--temp", "0", "--mmproj", mmproj,
                                         "--image-budget", IMAGE_BUDGET],
                                  model=model)
        state["proc"], state["base"] = proc, base
        state["client"] = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0,
                                        timeout=120)
    return state["client"], state["base"]


def metric(base, name):
    text = urllib.request.urlopen(urllib.request.Request(
        base + "/metrics", headers={"Authorization": "Bearer " + KEY})).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {name} in /metrics")


def test_image_chat(client, base):
    vc, vbase = vision()
    m = vc.models.retrieve(VISION_ID)
    check("image" in (m.model_extra or {}).get("meta", {}).get("input_modalities", []),
          f"/v1/models does not say the model takes pictures: {m}")
    answers = {}
    for i, _, _, n_ids in PICTURES:
        r = vc.chat.completions.create(model=VISION_ID, messages=ask(data_url(picture(i))),
                                       max_tokens=3)
        check(r.usage.prompt_tokens == n_ids,
              f"picture {i}: {r.usage.prompt_tokens} prompt tokens, the processor's {n_ids}")
        check(r.usage.completion_tokens >= 1 or r.choices[0].finish_reason == "stop",
              f"picture {i}: no answer {r}")
        answers[i] = r.choices[0].message.content
    hits = metric(vbase, 'cellm_image_cache_total{result="hit"}')
    cached = metric(vbase, "cellm_prompt_cached_tokens_total")
    r = vc.chat.completions.create(model=VISION_ID, messages=ask(data_url(picture(0))),
                                   max_tokens=3)
    check(r.choices[0].message.content == answers[0],
          f"the same picture again: {r.choices[0].message.content!r} != {answers[0]!r}")
    check(metric(vbase, 'cellm_image_cache_total{result="hit"}') == hits + 1,
          "the same picture was encoded again")
    got = metric(vbase, "cellm_prompt_cached_tokens_total") - cached
    check(got >= 48, f"the same picture again: {got} prompt tokens from the prefix cache")


def expect_400(c, model, messages, word, what):
    try:
        c.chat.completions.create(model=model, messages=messages, max_tokens=2)
        check(False, f"{what}: accepted")
    except openai.BadRequestError as e:
        msg = e.body.get("message", "") if isinstance(e.body, dict) else ""
        check(word in msg, f"{what}: message {msg!r} lacks {word!r}")


def test_asan_hostile(client, base):
    vc, _ = vision()
    good = picture(0)
    huge = png_of(30000, 30000, zlib.compress(b"\0" * 1000))  # 2.7 GB if it were decoded
    cases = [
        ("https://example.com/cat.png", "not fetched", "a remote URL"),
        ("http://127.0.0.1:1/x.png", "not fetched", "a local http URL"),
        ("file:///etc/passwd", "data: URL", "a file URL"),
        ("data:image/png," + "A" * 16, "base64", "a data: URL without base64"),
        ("data:text/plain;base64,aGVsbG8=", "PNG or JPEG", "a text data: URL"),
        ("data:image/png;base64", "data: URL", "no comma"),
        ("data:image/png;base64,@@@@", "base64", "bad base64"),
        ("data:image/png;base64,", "empty", "no bytes"),
        (data_url(good[:len(good) // 2]), "PNG", "a truncated PNG"),
        (data_url(b"this is no picture at all"), "PNG or JPEG", "bytes that are no picture"),
        (data_url(b"\xff\xd8\xff\xe0" + b"\0" * 40, "image/jpeg"), "JPEG", "a broken JPEG"),
        (data_url(huge), "30000", "a 30000x30000 PNG"),
    ]
    for url, word, what in cases:
        expect_400(vc, VISION_ID, ask(url), word, what)
    expect_400(vc, VISION_ID, [{"role": "user", "content": [{"type": "image_url"}]}], "url",
               "a part without a URL")
    expect_400(client, MODEL_ID, ask(data_url(good)), "--mmproj", "a model without a projector")
    many = [{"role": "user", "content": [{"type": "text", "text": "Compare these."}] +
             [{"type": "image_url", "image_url": {"url": data_url(good)}}] * 8}]
    expect_400(vc, VISION_ID, many, "keeps for pictures", "more pictures than --image-budget")
    r = vc.chat.completions.create(model=VISION_ID, messages=ask(data_url(good)), max_tokens=2)
    check(r.usage.prompt_tokens == PICTURES[0][3], "a picture after the bad ones")


def stop_vision():
    """Stops the fixture's server (a clean exit required, under ASan no
    leaks), also when a test failed."""
    proc = state.pop("proc", None)
    if proc:
        stop_server(proc, TEST)
        state["tmp"].cleanup()


if __name__ == "__main__":
    try:
        run(TEST, [("test_image_chat", test_image_chat),
                   ("test_asan_hostile", test_asan_hostile)], after=lambda c, b: stop_vision())
    finally:
        stop_vision()
