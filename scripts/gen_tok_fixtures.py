#!/usr/bin/env python3
"""gen_tok_fixtures.py - tokenizer parity fixtures from llama.cpp.

Builds a deterministic corpus of a few thousand strings (English, code,
whitespace runs, numbers, contractions, punctuation, many scripts, emoji
sequences, combining marks, special-token text, empty and invalid UTF-8)
and tokenizes each with llama.cpp (through llama-cpp-python, vocab only),
writing the expected ids to tests/data/tok/<name>.bin for
tests/test_tokenizer.c. It also records the id count and hash of a 1 MB
text that the test generates itself (big_text() below, mirrored in C).

For a BPE model it also checks the other pre-tokenizers on the same
vocabulary: a vocabulary-only copy of the file with tokenizer.ggml.pre
set to each of PRE_VARIANTS goes through llama.cpp, and the ids go to
tests/data/tok/<name>-<pre>.bin (the test builds the same copy in memory).

    pip install llama-cpp-python   # builds llama.cpp from source
    python3 scripts/gen_tok_fixtures.py smollm2=/path/smollm2.gguf gemma3=/path/gemma3.gguf

File format (all integers little-endian):
    "CTOKFIX1"                      magic
    u32 n_cases
    n_cases x { u8 flags (1 = add special, 2 = parse special),
                u32 n_bytes, bytes, u32 n_ids, i32 ids[n_ids] }
    u64 big_len, u32 big_n_ids, u64 big_hash   (flags 0 for the 1 MB text)
"""
import random
import struct
import sys
import unicodedata

ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world!",
    "It was the best of times, it was the worst of times.",
    "I can't believe it's already 2024; we'll see what happens.",
    "She said, \"Don't go there!\" and he replied: 'Why not?'",
    "Mr. Smith paid $1,234.56 for 3 items (about 411.52 each).",
    "E-mail me at john.doe@example.com or visit https://example.org/path?q=1&r=2#frag",
    "Tokenization is the process of splitting text into tokens.",
    "In 1969, Apollo 11 landed on the Moon.",
    "They're here, you've seen them, I'd say we'd better go, he'll agree.",
    "YOU'RE RIGHT, I'M SURE THEY'LL COME, WE'VE WAITED, HE'D KNOW.",
    "What?! No way... Really??? Yes!!!",
    "A\u00a0non-breaking space and an em dash \u2014 and an ellipsis\u2026",
    "naïve café résumé coöperate façade jalapeño",
]
WORDS = ("the of and to in is was for on that with as by at from this be or are an it "
         "have not but had his they you were her she which their all one we there been "
         "can has more if will would what about when who up out so said them some could "
         "time into other than then now only its these two first may any new like our "
         "over such after most very through just where much because before good well "
         "model token engine memory batch cache kernel quantize stream decode").split()
CODE = [
    "int main(int argc, char **argv) {\n    printf(\"%d\\n\", argc);\n    return 0;\n}\n",
    "def f(x):\n\treturn [i ** 2 for i in range(x) if i % 2 == 0]\n",
    "for (size_t i = 0; i < n; i++) { a[i] += b[i] * c; }",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "<html><head><title>Test</title></head><body><p class=\"x\">Hi</p></body></html>",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "x := <-ch; if err != nil { return fmt.Errorf(\"wrap: %w\", err) }",
    "fn main() -> Result<(), Box<dyn Error>> { let v: Vec<u8> = vec![0; 16]; Ok(()) }",
    "#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))\n",
    "    if (x) {\n        y++;\n    }\n\n\n",
    "const f = async (a, b) => { await g(a ?? b); return a?.b?.c || []; };",
    "$ ls -la | grep '^d' | awk '{print $9}' > dirs.txt 2>&1 && echo done",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f<<=1;g>>=2;h&=3;i|=4;j^=5;k~=l",
]
SCRIPTS = [
    "日本語のテキストです。東京は日本の首都です。",
    "中文文本测试，你好世界！我们今天去北京。",
    "한국어 텍스트입니다. 안녕하세요, 세계!",
    "مرحبا بالعالم، هذا نص عربي للاختبار.",
    "שלום עולם, זהו טקסט בעברית.",
    "नमस्ते दुनिया, यह हिंदी में एक परीक्षण है। क्षत्रिय ज्ञान",
    "Привет, мир! Это тест на русском языке.",
    "Γειά σου κόσμε! Αυτό είναι ελληνικό κείμενο.",
    "สวัสดีชาวโลก นี่คือข้อความภาษาไทย",
    "Xin chào thế giới, đây là tiếng Việt.",
    "ሰላም ለዓለም", "ᚠᚢᚦᚨᚱᚲ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕄𝕒𝕥𝕙 𝒮𝒸𝓇𝒾𝓅𝓉", "Ⅻ ½ ² ③ ٣ ۴ ४ ๕ 〇",
]
EMOJI = [
    "😀", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵🇺🇸", "1️⃣", "❤️", "🧑🏿‍🚀", "👋🏻👋🏼👋🏽👋🏾👋🏿",
    "🤷‍♀️", "🐈‍⬛", "😶‍🌫️", "©️®️™️",
]
COMBINING = [
    "e\u0301", "a\u0300\u0301\u0302\u0303", "n\u0303o", "Z\u0351\u0352\u0353a\u0354\u0355l\u0356g\u0357o",
    "\u0915\u094d\u0937", "\u1100\u1161\u11a8", "A\u030a", "\u0041\u0308\u0304",
]
SPECIAL_TEXT = [
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>", "<|im_start|><|im_end|>", "text<|endoftext|>more text",
    "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<eos>", "<pad><unk><mask>", "[multimodal]", "</s>", "<start_of_image>x<end_of_image>",
    "<unused0> <unused99>", "<|im_start|", "<bos", "< bos >", "<<bos>>", "<bos><bos>",
    "a  b   c    d", "\n\n\n\n", "\t\t\t", "x\n\ny", "  <bos>  ", "<start_of_turn>\n\n",
]


def rand_unicode(rng):
    """A random assigned, non-surrogate code point from a spread of blocks."""
    blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
              (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F),
              (0x2190, 0x23FF), (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3),
              (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF), (0x1D400, 0x1D7FF), (0x20000, 0x2A6DF)]
    while True:
        lo, hi = rng.choice(blocks)
        c = chr(rng.randint(lo, hi))
        # Characters assigned after the Unicode version of Python's
        # unicodedata (which generated the library's table) are left out.
        if unicodedata.category(c) not in ("Cn", "Cs"):
            return c


def corpus():
    rng = random.Random(1234)
    out = []  # (bytes, flags)

    def add(s, flags=(1, 0)):
        b = s if isinstance(s, bytes) else s.encode("utf-8")
        for f in flags:
            out.append((b, f))

    add("", (0, 1))
    for s in ENGLISH + CODE + SCRIPTS + EMOJI + COMBINING:
        add(s, (0, 1))
        add(" " + s, (0,))
        add(s + "\n", (0,))
    for s in SPECIAL_TEXT:
        add(s, (0, 1, 2, 3))
    # Sentences from words, with random punctuation and case.
    for _ in range(700):
        n = rng.randint(1, 25)
        ws = []
        for _ in range(n):
            w = rng.choice(WORDS)
            r = rng.random()
            if r < 0.1:
                w = w.capitalize()
            elif r < 0.13:
                w = w.upper()
            ws.append(w)
            if rng.random() < 0.15:
                ws.append(rng.choice([",", ".", ";", ":", "!", "?", "'s", "n't", "'ll", "'RE", "...", " -", "\""]))
        add(" ".join(ws), (rng.choice([0, 1]),))
    # Whitespace runs.
    wsp = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n", "\u3000", "\u00a0", "\u2009", "\x0b", "\x0c", "\x85", "\x1c"]
    for _ in range(350):
        parts = []
        for _ in range(rng.randint(1, 8)):
            parts.append("".join(rng.choice(wsp) for _ in range(rng.randint(0, 6))))
            parts.append(rng.choice(WORDS + ["123", "!", "(x)", "é", "日本", "😀"]))
        if rng.random() < 0.5:
            parts.append("".join(rng.choice(wsp) for _ in range(rng.randint(1, 5))))
        add("".join(parts), (rng.choice([0, 1]),))
    # Numbers.
    for _ in range(300):
        k = rng.random()
        if k < 0.3:
            s = str(rng.randint(0, 10 ** rng.randint(1, 40)))
        elif k < 0.5:
            s = "%d.%d" % (rng.randint(0, 99999), rng.randint(0, 99999))
        elif k < 0.7:
            s = "%s %s" % (rng.randint(0, 10 ** 7), rng.choice(WORDS))
        elif k < 0.85:
            s = "+1 (%03d) %03d-%04d" % (rng.randint(0, 999), rng.randint(0, 999), rng.randint(0, 9999))
        else:
            s = "".join(rng.choice("0123456789٠١٢٣४५๖²³½, .") for _ in range(rng.randint(1, 30)))
        add(s, (rng.choice([0, 1]),))
    # Contractions and punctuation clusters.
    cons = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'LL", "'D", "'x", "'", "''"]
    punct = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["…", "—", "«", "»", "¿", "¡", "、", "。", "・"]
    for _ in range(350):
        parts = []
        for _ in range(rng.randint(1, 8)):
            r = rng.random()
            if r < 0.35:
                parts.append(rng.choice(WORDS) + rng.choice(cons))
            elif r < 0.7:
                parts.append("".join(rng.choice(punct) for _ in range(rng.randint(1, 6))))
            else:
                parts.append(rng.choice(WORDS))
            parts.append(rng.choice(["", " ", "  ", "\n"]))
        add("".join(parts), (rng.choice([0, 1]),))
    # Random Unicode mixes.
    for _ in range(500):
        s = "".join(rand_unicode(rng) if rng.random() < 0.6 else rng.choice(" \n\t")
                    for _ in range(rng.randint(1, 40)))
        add(s, (rng.choice([0, 1]),))
    # Emoji and combining sequences in text.
    for _ in range(200):
        parts = [rng.choice(EMOJI + COMBINING + WORDS + SCRIPTS[:3]) for _ in range(rng.randint(1, 6))]
        add(rng.choice(["", " "]).join(parts), (rng.choice([0, 1]),))
    # Invalid UTF-8.
    bad = [b"\xff", b"\xfe\xff", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xc3", b"\xe2\x82",
           b"\xf0\x9f\x98", b"\x80\x80", b"a\xffb", b"\xc3\x28", b"\xf8\x88\x80\x80\x80",
           b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"caf\xe9", b"\x00", b"a\x00b", b" \xe2\x96\x81 "]
    for b in bad:
        add(b, (0, 1))
    for _ in range(300):
        n = rng.randint(1, 40)
        b = bytes(rng.choice([rng.randint(0, 255), rng.randint(0x80, 0xBF), rng.randint(0xC0, 0xFF),
                              ord(rng.choice("ab \n"))]) for _ in range(n))
        add(b, (rng.choice([0, 1]),))
    # Longer documents: paragraphs glued from everything above.
    for _ in range(80):
        pieces = [rng.choice(ENGLISH + CODE + SCRIPTS + EMOJI) for _ in range(rng.randint(3, 12))]
        add(rng.choice(["\n", "\n\n", " ", ""]).join(pieces), (rng.choice([0, 1]),))
    return out


def big_text():
    """The 1 MB text test_tokenizer.c builds with the same generator."""
    x = 88172645463325252
    words = WORDS
    seps = [" ", " ", " ", " ", ", ", ". ", "\n", "\n\n", "  ", "'s ", " 12", "3 ", "日本 ", "😀 "]
    out = bytearray()
    while len(out) < (1 << 20):
        x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 7
        x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
        out += words[x % len(words)].encode()
        out += seps[(x >> 32) % len(seps)].encode()
    return bytes(out[: 1 << 20])


def ids_hash(ids):
    """FNV-1a 64 over the ids as little-endian int32, mirrored in C."""
    h = 0xCBF29CE484222325
    for b in struct.pack("<%di" % len(ids), *ids):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def lenient_decode_ok(b):
    """False when llama.cpp's UTF-8 decoder would yield a code point past
    U+10FFFF (from F4 90.. to F7 ..), which makes its BPE path throw."""
    i = 0
    while i < len(b):
        c = b[i]
        if 0xF0 <= c <= 0xF7 and i + 3 < len(b) and all(0x80 <= x <= 0xBF for x in b[i + 1:i + 4]):
            cp = ((c & 7) << 18) | ((b[i + 1] & 0x3F) << 12) | ((b[i + 2] & 0x3F) << 6) | (b[i + 3] & 0x3F)
            if cp > 0x10FFFF:
                return False
            i += 4
        else:
            i += 1
    return True


PRE_VARIANTS = ["llama-bpe", "qwen2", "gpt-2", "default"]


def write_pre_variant(src, dst, pre):
    """Copies the metadata of GGUF `src` (no tensors) to `dst` with
    tokenizer.ggml.pre = pre."""
    from gguf import GGUFReader, GGUFWriter, GGUFValueType
    r = GGUFReader(src)
    w = GGUFWriter(dst, arch=r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        v = pre if k == "tokenizer.ggml.pre" else f.contents()
        t = f.types[0]
        w.add_key_value(k, v, t, sub_type=f.types[1] if t == GGUFValueType.ARRAY else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_fixture(name, path, cases):
    from llama_cpp import Llama
    import llama_cpp

    m = Llama(model_path=path, vocab_only=True, verbose=False)
    bpe = m.metadata.get("tokenizer.ggml.model") == "gpt2"
    blob = bytearray()
    n = 0
    for b, flags in cases:
        if bpe and not lenient_decode_ok(b):
            continue
        ids = m.tokenize(b, add_bos=bool(flags & 1), special=bool(flags & 2))
        blob += struct.pack("<BI", flags, len(b)) + b + struct.pack("<I", len(ids))
        blob += struct.pack("<%di" % len(ids), *ids)
        n += 1
    big = big_text()
    big_ids = m.tokenize(big, add_bos=False, special=False)
    data = b"CTOKFIX1" + struct.pack("<I", n) + bytes(blob)
    data += struct.pack("<QIQ", len(big), len(big_ids), ids_hash(big_ids))
    out = "tests/data/tok/%s.bin" % name
    with open(out, "wb") as f:
        f.write(data)
    print("%s: %d cases, %d bytes, 1 MB text -> %d ids (llama-cpp-python %s, Unicode %s)"
          % (out, n, len(data), len(big_ids), llama_cpp.__version__, unicodedata.unidata_version))
    return bpe


def main():
    import os
    import tempfile

    targets = dict(a.split("=", 1) for a in sys.argv[1:])
    if not targets:
        sys.exit(__doc__)
    cases = corpus()
    for name, path in targets.items():
        if write_fixture(name, path, cases):
            with tempfile.TemporaryDirectory() as tmp:
                for pre in PRE_VARIANTS:
                    dst = os.path.join(tmp, "%s-%s.gguf" % (name, pre))
                    write_pre_variant(path, dst, pre)
                    write_fixture("%s-%s" % (name, pre), dst, cases)


if __name__ == "__main__":
    main()
