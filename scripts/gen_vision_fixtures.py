#!/usr/bin/env python3
"""Reference data for the vision path (Idefics3 / SmolVLM): transformers
builds a tiny Idefics3 model (SigLIP vision encoder, pixel-shuffle
connector, llama text model) from a config with seeded random weights,
saves it as a Hugging Face folder with its processor files under
OUT/idefics3/, and records what transformers computes on two images of
different aspect ratios, drawn here from a fixed seed:

  OUT/idefics3/              the folder `cellm convert` reads
  OUT/idefics3-img0.rgb      image 0, raw RGB8 rows (size in vision.txt)
  OUT/idefics3-img1.rgb      image 1
  OUT/idefics3-imgI.png      the same pixels as PNG (for `cellm run --image`)
  OUT/idefics3.txt           shapes, ids and logits (text, below)
  OUT/idefics3-I-pixels.f32  image I's pixel values (frames x 3 x H x W, float32 LE)
  OUT/idefics3-I-enc.f32     the vision encoder's output (frames x patches x hidden)
  OUT/idefics3-I-conn.f32    the connector's output (frames x tokens x text hidden)
  OUT/idefics3-lanczos.u8    PIL's LANCZOS resizes of image 0 (the sizes in vision.txt)

idefics3.txt:
  processor CLASS            the image processor class that made the pixels
  image I W H ROWS COLS FRAMES FH FW
  lanczos W H                one resize of image 0 in idefics3-lanczos.u8, in order
  ids I N id...              the processor's prompt ids for image I
  gen I N id...              greedy continuation (full recompute)
  logits I STEP v...         the logits at each greedy step (float32)

Needs: torch, transformers, tokenizers, safetensors, pillow, numpy.
Usage: python3 scripts/gen_vision_fixtures.py [OUT_DIR]  (default tests/data/vision)
"""
import json
import math
import os
import sys

import numpy as np
import torch
import transformers
from PIL import Image
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = ("Describe this image. What is in the picture? A red square, a blue circle and a green "
        "line on a grey background. The cat sat on the mat. 0 1 2 3 4 5 6 7 8 9. ") * 8
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>",
            "<image>", "<global-img>"] + [f"<row_{r}_col_{c}>" for r in range(1, 7)
                                          for c in range(1, 7)]
CHAT_TEMPLATE = ("<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
                 "{% if message['content'][0]['type'] == 'image' %}:{% else %}: {% endif %}"
                 "{% for part in message['content'] %}{% if part['type'] == 'text' %}"
                 "{{ part['text'] }}{% elif part['type'] == 'image' %}<image>{% endif %}"
                 "{% endfor %}<end_of_utterance>\n{% endfor %}"
                 "{% if add_generation_prompt %}Assistant:{% endif %}")
VOCAB = 384
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              image_size=32, patch_size=8, layer_norm_eps=1e-6)
TEXT_CFG = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=1, eos_token_id=2,
                pad_token_id=0, tie_word_embeddings=False)
SIZES = [(96, 60), (20, 70)]  # W x H of the two images
LANCZOS = [(64, 40), (32, 32), (150, 94), (17, 33), (96, 7)]
N_GEN = 3


def make_image(w, h, rng):
    """Smooth gradients, hard edges and noise: every part of a resampler's
    kernel (negative lobes, clipping) matters on it."""
    y, x = np.mgrid[0:h, 0:w]
    r = (x * 255 // max(w - 1, 1))
    g = (y * 255 // max(h - 1, 1))
    b = np.where(((x // 5) + (y // 7)) % 2 == 0, 230, 20)
    img = np.stack([r, g, b], axis=-1).astype(np.int32)
    img += rng.integers(-20, 21, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def make_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=340, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                                eos_token="<end_of_utterance>", unk_token=None,
                                                pad_token="<|endoftext|>")
    return fast


def randomize(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name or "position_embedding" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            elif "lm_head" in name:
                p.copy_(4.0 * torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
            else:
                fan_in = p.numel() // p.shape[0]
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))


def pick_image_processor():
    names = sorted(n for n in dir(transformers) if "Idefics3" in n)
    print("transformers Idefics3 names:", names)
    for n in ("Idefics3ImageProcessorPil", "Idefics3ImageProcessor"):
        cls = getattr(transformers, n, None)
        if cls is not None:
            print("image processor:", n, cls.__module__)
            return n, cls
    raise SystemExit("no Idefics3 image processor")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "data", "vision")
    folder = os.path.join(out, "idefics3")
    os.makedirs(folder, exist_ok=True)
    print("torch", torch.__version__, "transformers", transformers.__version__)
    rng = np.random.default_rng(1234)
    images = [make_image(w, h, rng) for w, h in SIZES]
    for i, img in enumerate(images):
        img.tofile(os.path.join(out, f"idefics3-img{i}.rgb"))
        Image.fromarray(img).save(os.path.join(out, f"idefics3-img{i}.png"))
    lines = ["# transformers reference for a random Idefics3 model; made by "
             "scripts/gen_vision_fixtures.py"]
    # PIL's LANCZOS alone, on sizes up and down.
    with open(os.path.join(out, "idefics3-lanczos.u8"), "wb") as f:
        for w, h in LANCZOS:
            r = np.asarray(Image.fromarray(images[0]).resize((w, h), Image.Resampling.LANCZOS))
            f.write(np.ascontiguousarray(r, dtype=np.uint8).tobytes())
            lines.append(f"lanczos {w} {h}")

    tokenizer = make_tokenizer()
    pname, pcls = pick_image_processor()
    improc = pcls(do_resize=True, size={"longest_edge": 2 * VISION["image_size"]},
                  max_image_size={"longest_edge": VISION["image_size"]},
                  do_image_splitting=True, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    seq_len = (VISION["image_size"] // VISION["patch_size"]) ** 2 // 4
    processor = transformers.Idefics3Processor(image_processor=improc, tokenizer=tokenizer,
                                               image_seq_len=seq_len,
                                               chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(folder)
    lines.insert(1, f"processor {pname}")
    tokenizer = processor.tokenizer
    image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    print("tokenizer size", len(tokenizer), "image token", image_token_id)

    cfg = transformers.Idefics3Config(vision_config=VISION, text_config=TEXT_CFG, scale_factor=2,
                                      image_token_id=image_token_id, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    model = transformers.Idefics3ForConditionalGeneration(cfg).eval()
    randomize(model, torch.Generator().manual_seed(23))
    model.save_pretrained(folder, safe_serialization=True)
    inner = model.model
    print("modules:", [n for n, _ in inner.named_children()])

    for i, img in enumerate(images):
        msgs = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": "Describe this image."}]}]
        prompt = processor.apply_chat_template(msgs, add_generation_prompt=True)
        enc = processor(text=[prompt], images=[[Image.fromarray(img)]], return_tensors="pt")
        pv = enc["pixel_values"][0].float()  # frames x 3 x H x W
        rows = int(enc["rows"][0][0]) if "rows" in enc else -1
        cols = int(enc["cols"][0][0]) if "cols" in enc else -1
        ids = enc["input_ids"][0].tolist()
        n_img = sum(1 for t in ids if t == image_token_id)
        frames = pv.shape[0]
        if rows < 0:  # count the tiles from the prompt instead
            rows = sum(1 for r in range(1, 7) if tokenizer.convert_tokens_to_ids(f"<row_{r}_col_1>") in ids)
            cols = sum(1 for c in range(1, 7) if tokenizer.convert_tokens_to_ids(f"<row_1_col_{c}>") in ids)
        print(f"image {i}: {SIZES[i]} -> pixel_values {tuple(pv.shape)}, rows {rows} cols {cols}, "
              f"{len(ids)} ids, {n_img} image tokens")
        pv.numpy().astype("<f4").tofile(os.path.join(out, f"idefics3-{i}-pixels.f32"))
        with torch.no_grad():
            hs = inner.vision_model(pixel_values=pv).last_hidden_state
            conn = inner.connector(hs)
        hs.numpy().astype("<f4").tofile(os.path.join(out, f"idefics3-{i}-enc.f32"))
        conn.numpy().astype("<f4").tofile(os.path.join(out, f"idefics3-{i}-conn.f32"))
        lines.append(f"image {i} {SIZES[i][0]} {SIZES[i][1]} {rows} {cols} {frames} "
                     f"{pv.shape[2]} {pv.shape[3]}")
        lines.append(f"ids {i} {len(ids)} " + " ".join(map(str, ids)))
        seq = list(ids)
        gen, rows_out = [], []
        for step in range(N_GEN):
            with torch.no_grad():
                lg = model(input_ids=torch.tensor([seq]), pixel_values=enc["pixel_values"],
                           pixel_attention_mask=enc.get("pixel_attention_mask")).logits[0, -1]
            top = torch.topk(lg, 2)
            print(f"  step {step}: top {int(top.indices[0])} gap {float(top.values[0] - top.values[1]):.4f}")
            rows_out.append(f"logits {i} {step} " + " ".join(f"{v:.6f}" for v in lg.tolist()))
            gen.append(int(top.indices[0]))
            seq.append(gen[-1])
        lines.append(f"gen {i} {len(gen)} " + " ".join(map(str, gen)))
        lines.extend(rows_out)
    with open(os.path.join(out, "idefics3.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "VERSIONS"), "w") as f:
        f.write(json.dumps({"torch": torch.__version__,
                            "transformers": transformers.__version__}) + "\n")
    size = sum(os.path.getsize(os.path.join(folder, fn)) for fn in os.listdir(folder))
    print("folder:", sorted(os.listdir(folder)), size, "bytes")


if __name__ == "__main__":
    main()
