"""The run's processing class: the model's tokenizer, or, for image rows on a vision-language model, its processor.

TRL's ``SFTTrainer`` trains a vision-language model when its ``processing_class`` is a processor
(``ProcessorMixin``) and the data has an ``images`` (or ``image``) column: it then collates with
``DataCollatorForVisionLanguageModeling`` (chat template, image placeholders expanded, pixels, grids). Halo
hands it the processor ``AutoProcessor`` loads, as a TRL script does.

One difference, where the machine cannot load the processor whole: transformers' video processors need
torchvision (Qwen-VL's processors hold one beside the image processor), and torchvision has no build that
imports beside the CPU build of torch this project installs. SFT trains on images only (TRL's collator passes
no videos), so there the processor's own class is loaded without its video part
(``processor_without_video``): the same class, tokenizer and image processor, and ``save_pretrained`` writes
the video processor's stored settings back, so the checkpoint's processor loads whole wherever torchvision is.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

#: Columns that hold a row's images, as TRL's SFTTrainer detects a vision dataset.
IMAGE_COLUMNS = ("images", "image")
#: Where a processor's settings are stored (``processor_config.json`` holds every sub-processor's in transformers 5).
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
_VIDEO_FILE = "video_preprocessor_config.json"


def has_images(columns) -> bool:
    return any(c in (columns or ()) for c in IMAGE_COLUMNS)  # a streamed dataset may not know its columns


def is_vision_language(config) -> bool:
    """A composite whose config holds a vision tower's (``vision_config``): Qwen3-VL-MoE, GLM-4.5V, ..."""
    return getattr(config, "vision_config", None) is not None


def build_processing_class(model_path: str, dataset):
    """The tokenizer, or the processor where the model is a vision-language composite and the data has images."""
    from transformers import AutoConfig, AutoTokenizer

    if has_images(dataset.column_names) and is_vision_language(AutoConfig.from_pretrained(model_path)):
        return load_processor(model_path)
    return AutoTokenizer.from_pretrained(model_path)


def load_processor(model_path: str):
    """``AutoProcessor.from_pretrained``; where only its video processor cannot load (no torchvision), the same
    processor class without it."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(model_path)
    except ImportError as exc:
        if "torchvision" not in str(exc).lower():
            raise
        without = processor_without_video(processor_class_of(model_path))
        if without is None:
            raise
        return without.from_pretrained(model_path)


def processor_class_of(model_path: str):
    """The class ``AutoProcessor`` picks: the stored ``processor_class``, else the one transformers maps the model type to."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    for name in PROCESSOR_FILES:
        path = Path(model_path) / name
        if path.is_file():
            stored = json.loads(path.read_text()).get("processor_class")
            if stored:
                return getattr(transformers, stored)
    return getattr(transformers, PROCESSOR_MAPPING_NAMES[AutoConfig.from_pretrained(model_path).model_type])


def processor_without_video(cls):
    """``cls`` with ``video_processor`` left out of its parts (``None`` if it has none): it loads and builds from the
    tokenizer and image processor alone; saved, it keeps its class name and writes the source's video settings back."""
    attributes = [a for a in cls.get_attributes() if a != "video_processor"]
    if len(attributes) == len(cls.get_attributes()):
        return None

    class WithoutVideo(cls):
        @classmethod
        def get_attributes(klass):
            return list(attributes)

        @classmethod
        def from_pretrained(klass, pretrained_model_name_or_path, *args, **kwargs):
            processor = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
            processor._halo_source = Path(pretrained_model_name_or_path)
            return processor

        def to_dict(self):
            output = super().to_dict()
            stored = _stored_video_settings(getattr(self, "_halo_source", None))
            if stored is not None:
                output["video_processor"] = stored
            return output

        def save_pretrained(self, save_directory, *args, **kwargs):
            result = super().save_pretrained(save_directory, *args, **kwargs)
            source = getattr(self, "_halo_source", None)
            if source is not None and (source / _VIDEO_FILE).is_file():
                shutil.copyfile(source / _VIDEO_FILE, Path(save_directory) / _VIDEO_FILE)
            return result

    WithoutVideo.__name__ = WithoutVideo.__qualname__ = cls.__name__  # saved as the stock class
    WithoutVideo.__module__ = cls.__module__
    WithoutVideo.__doc__ = f"{cls.__name__} without its video processor (Halo: torchvision is missing; images only)."
    return WithoutVideo


def _stored_video_settings(source: Path | None) -> dict | None:
    if source is None or not (source / "processor_config.json").is_file():
        return None
    stored = json.loads((source / "processor_config.json").read_text()).get("video_processor")
    return stored if isinstance(stored, dict) else None
