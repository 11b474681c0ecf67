"""Regenerates the embedded vision-language default: a tiny Qwen3-VL-MoE, its processor, tiny images and chat data.

    python templates/tiny/generate_vlm.py   # after generate.py; rewrites templates/tiny/{vl-model,data/images,data/colours.jsonl}

- ``vl-model/``: the config is the qwen3-vl-moe family's tiny model (``halo_core.tiny`` with the plugin's
  ``tiny_config``, which keeps the deepstack path running) with the vocabulary of the arithmetic tokenizer plus
  Qwen-VL's four vision tokens, whose ids the config names; the processor is Qwen3-VL's with a Qwen-VL image
  processor at small sizes (a 32x32 image is one merged token) and a chat template that places an image between
  the vision start and end tokens.
- ``data/images/``: a handful of PNGs (a few hundred bytes each): a coloured square or disc at four sizes, so the image
  token counts differ from row to row.
- ``data/colours.jsonl``: TRL's conversational format with an ``images`` column (paths relative to the file):
  a question about the picture, answered with its colour, which only the image tells; the questions differ in
  length, so every batch is padded.
Deterministic: the same files every run.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
#: Patch 16, temporal 2, merge 2: an image's side is rounded to a multiple of 32, and each 32x32 block is one token.
IMAGE_PROCESSOR = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "min_pixels": 32 * 32, "max_pixels": 96 * 96}
#: What a machine with torchvision loads as the video processor (this project's CPU setup has none: images only).
VIDEO_PROCESSOR = {"video_processor_type": "Qwen3VLVideoProcessor", "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                   "size": {"shortest_edge": 32 * 32, "longest_edge": 96 * 96}}
COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (40, 70, 220), "yellow": (235, 200, 30)}
#: (width, height): 1, 2, 2 and 4 image tokens.
SIZES = [(32, 32), (64, 32), (32, 64), (64, 64)]
QUESTIONS = ["Colour?", "What colour is this?", "What colour is the shape in this picture?",
             "Look at the picture and tell me, in one word, which colour the shape has."]
ROWS = 1200


def images() -> dict[str, tuple[str, tuple[int, int]]]:
    """Two pictures a colour: a square and a disc, on a grey ground, at two of the four sizes. Returns
    ``{file name: (colour, size)}``."""
    from PIL import Image, ImageDraw

    folder = HERE / "data" / "images"
    folder.mkdir(parents=True, exist_ok=True)
    made = {}
    for index, (colour, rgb) in enumerate(COLOURS.items()):
        for shape in ("square", "disc"):
            width, height = SIZES[(2 * index + (shape == "disc")) % len(SIZES)]
            picture = Image.new("RGB", (width, height), (128, 128, 128))
            draw = ImageDraw.Draw(picture)
            box = (width // 6, height // 6, width - width // 6 - 1, height - height // 6 - 1)
            if shape == "square":
                draw.rectangle(box, fill=rgb)
            else:
                draw.ellipse(box, fill=rgb)
            name = f"{colour}-{shape}.png"
            picture.save(folder / name, optimize=True)
            made[name] = (colour, (width, height))
    return made


def rows(pictures: dict[str, tuple[str, tuple[int, int]]], seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    names = sorted(pictures)
    out = []
    for _ in range(ROWS):
        name = rng.choice(names)
        out.append({"images": [f"images/{name}"],
                    "messages": [{"role": "user", "content": rng.choice(QUESTIONS)},
                                 {"role": "assistant", "content": f"It is {pictures[name][0]}."}]})
    return out


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from halo_core.registry import discover
    from halo_core.tiny import tiny_config
    from halo_core.trainers.parts.processor import processor_class_of, processor_without_video

    pictures = images()
    (HERE / "data" / "colours.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(pictures)))

    model_dir = HERE / "vl-model"
    model_dir.mkdir(exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(HERE / "model")
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    ids = dict(zip(["vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"], tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
    family = discover(strict=False).by_name("qwen3-vl-moe").family
    config = tiny_config("qwen3_vl_moe", {**family.tiny_config, **ids,
                                          "text_config": {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
                                                          "eos_token_id": tokenizer.eos_token_id}})
    config.architectures = [family.model_class]
    config.save_pretrained(model_dir)

    # The processor class without its video part builds here with no torchvision; the stored video settings are added after.
    processor_class = processor_without_video(processor_class_of(model_dir))
    processor = processor_class(image_processor=Qwen2VLImageProcessorPil(**IMAGE_PROCESSOR), tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(model_dir)
    stored = json.loads((model_dir / "processor_config.json").read_text())
    stored["video_processor"] = VIDEO_PROCESSOR
    (model_dir / "processor_config.json").write_text(json.dumps(stored, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
