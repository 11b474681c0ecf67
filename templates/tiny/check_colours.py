"""Whether a run of the embedded vision-language default learned to read its pictures: for each bundled picture,
the likeliest of the four answers ("It is red.", ...) under the trained checkpoint.

    python templates/tiny/check_colours.py runs/tiny-qwen3-vl-moe    # prints each picture's answer and the count right

The colour is in the picture only (the questions name none), so a model that ignores the image gets about a
quarter right. Loads the checkpoint as transformers does (``Qwen3VLMoeForConditionalGeneration``) and its processor
as ``halo launch`` does (``load_processor``: the stock class, without its video part where torchvision is missing).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

HERE = Path(__file__).parent
COLOURS = ("red", "green", "blue", "yellow")


def answer(model, processor, picture) -> str:
    """The colour whose answer has the highest log-probability (summed over the whole conversation)."""
    scores = {}
    for colour in COLOURS:
        messages = [{"role": "user", "content": [{"type": "image", "image": picture}, {"type": "text", "text": "What colour is this?"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": f"It is {colour}."}]}]
        batch = processor.apply_chat_template([messages], tokenize=True, return_dict=True, return_tensors="pt")
        with torch.no_grad():
            logits = model(**batch).logits[0, :-1]
        scores[colour] = torch.log_softmax(logits, -1).gather(-1, batch["input_ids"][0, 1:, None]).sum().item()
    return max(scores, key=scores.get)


def main(run_dir: str) -> int:
    from PIL import Image
    from transformers import Qwen3VLMoeForConditionalGeneration

    sys.path.insert(0, str(HERE.parents[1]))
    from halo_core.trainers.parts.processor import load_processor

    model = Qwen3VLMoeForConditionalGeneration.from_pretrained(run_dir).eval()
    processor = load_processor(run_dir)
    right = 0
    pictures = sorted((HERE / "data" / "images").glob("*.png"))
    for path in pictures:
        said = answer(model, processor, Image.open(path).convert("RGB"))
        right += said == path.name.split("-")[0]
        print(f"{path.name}: {said}")
    print(f"{right} of {len(pictures)} right")
    return right


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/tiny-qwen3-vl-moe")
