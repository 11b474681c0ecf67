"""What ``embed`` builds around a laid-out Hugging Face model: a stock ``SentenceTransformer`` (a ``Transformer`` module
over the model, then ``Pooling``), and the sentence-transformers directory it saves beside Halo's checkpoint.

The model is the family's causal LM as Halo builds and lays it out (checkpoint read straight into the layout, experts
split); the ``Transformer`` module runs it with transformers' ``text-generation`` task and reads the last hidden state
(``hidden_states[-1]``, after the final norm), as a stock ``SentenceTransformer`` loaded from the saved directory does.
"""

from __future__ import annotations

import json
import os

from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

#: How the ``Transformer`` module reads a causal LM's output: its last hidden state, as token embeddings.
MODALITY = {"text": {"method": "forward", "method_output_name": ["hidden_states", -1]}}
OUTPUT = "token_embeddings"
POOLING = {"mean": "mean", "lasttoken": "lasttoken"}


class LaidOutTransformer(Transformer):
    """Stock ``Transformer`` over a model already built and laid out (``model_kwargs={"laid_out": model}``) instead of
    one it loads; everything else (processor, modalities, forward) is the stock module's. It saves as the stock class."""

    def _load_model(self, model_name_or_path, transformer_task, config, backend, is_peft_model, **model_kwargs):
        return model_kwargs["laid_out"]

    def forward(self, features: dict, **kwargs) -> dict:
        """The stock forward for ``MODALITY``, calling the model as a module: the stock one calls ``model.forward``,
        which skips the module's hooks (FSDP2 gathers the root unit's parameters, the final norm's, in one)."""
        from sentence_transformers.base.modules.transformer import _NON_MODEL_FEATURE_KEYS

        inputs = {k: v for k, v in {**features, **kwargs}.items() if k not in _NON_MODEL_FEATURE_KEYS}
        output = self.model(**inputs, output_hidden_states=True, return_dict=True)
        features[self.module_output_name] = output.hidden_states[-1]
        return features


def sentence_transformer(model, model_name_or_path: str, pooling: str, max_seq_length: int | None) -> SentenceTransformer:
    """``model`` (laid out) under the ``Transformer`` and ``Pooling`` modules; the processor is read from ``model_name_or_path``."""
    transformer = LaidOutTransformer(model_name_or_path, transformer_task="text-generation", model_kwargs={"laid_out": model},
                                     modality_config=MODALITY, module_output_name=OUTPUT, max_seq_length=max_seq_length)
    pool = Pooling(transformer.get_embedding_dimension(), pooling_mode=POOLING[pooling])
    return SentenceTransformer(modules=[transformer, pool], device=str(next(model.parameters()).device))


def save_modules(st: SentenceTransformer, folder: str) -> None:
    """The sentence-transformers files over the Hugging Face checkpoint Halo wrote in ``folder`` (rank 0 only):
    ``modules.json``, ``config_sentence_transformers.json``, the ``Transformer`` module's config, each later module's
    folder. The weights and the tokenizer are the checkpoint's, so ``SentenceTransformer(folder)`` loads the trained model."""
    with open(os.path.join(folder, "config_sentence_transformers.json"), "w") as out:
        json.dump(st._get_model_config(), out, indent=2, sort_keys=True)
    modules = []
    for index, (name, module) in enumerate(st._modules.items()):
        if index == 0:
            module.save_config(folder)  # its weights and processor: the checkpoint's own files
            path, kind = "", Transformer
        else:
            path, kind = f"{index}_{type(module).__name__}", type(module)
            os.makedirs(os.path.join(folder, path), exist_ok=True)
            module.save(os.path.join(folder, path))
        modules.append({"idx": index, "name": name, "path": path, "type": f"{kind.__module__}.{kind.__name__}"})
    with open(os.path.join(folder, "modules.json"), "w") as out:
        json.dump(modules, out, indent=2)
