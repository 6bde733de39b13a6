"""Record the ATen ops real models emit, for the op list every decomposition must cover.

    python3 tools/record_model_ops.py OUT.json [--device cpu|cuda]

Runs small configs of GPT-2, Llama (GQA), BERT, T5, GPT-NeoX (Hugging Face, random weights,
nothing downloaded), a ResNet and a ViT, forward in eval mode under no_grad and in train mode,
under a TorchDispatchMode that writes down every ATen overload it sees (after torch's composite
ops have decomposed, in the device's forms: f32 on CPU, bf16 on CUDA, where attention picks its
fused kernels). Needs transformers, timm and torchvision (the GPU machine's image has them).
Output: {"ops": {op: [where, ...]}, "torch": version, "device": ...}. The committed list is
packages/prims/src/ember/prims/data/model_ops.json; merge runs with --merge.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        ns, name = func.name().split("::")
        self.ops.add(f"{ns}.{name.split('.')[0]}.{func._overloadname}")
        return func(*args, **(kwargs or {}))


def _hf(build: Callable[[], Any], inputs: Callable[[Any], dict[str, Any]]) -> Callable[..., Any]:
    def make(device: str, dtype: torch.dtype) -> tuple[Any, dict[str, Any]]:
        model = build().to(device=device, dtype=dtype)
        return model, inputs(model)
    return make


def models() -> dict[str, Callable[[str, torch.dtype], tuple[Any, dict[str, Any]]]]:
    import timm
    import torchvision
    import transformers as tf

    def ids(model: Any, n: int = 2, s: int = 16) -> dict[str, Any]:
        dev = next(model.parameters()).device
        return {"input_ids": torch.randint(0, 100, (n, s), device=dev),
                "attention_mask": torch.ones(n, s, dtype=torch.long, device=dev)}

    def t5_inputs(model: Any) -> dict[str, Any]:
        d = ids(model)
        d["decoder_input_ids"] = torch.randint(0, 100, (2, 8), device=d["input_ids"].device)
        return d

    def image(model: Any, size: int) -> dict[str, Any]:
        p = next(model.parameters())
        return {"x": torch.randn(2, 3, size, size, device=p.device, dtype=p.dtype)}

    small = {"vocab_size": 128, "max_position_embeddings": 64}
    return {
        "gpt2": _hf(lambda: tf.GPT2LMHeadModel(tf.GPT2Config(
            n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64)), ids),
        "llama": _hf(lambda: tf.LlamaForCausalLM(tf.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, **small)), ids),
        "bert": _hf(lambda: tf.BertModel(tf.BertConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            **small)), ids),
        "t5": _hf(lambda: tf.T5ForConditionalGeneration(tf.T5Config(
            d_model=64, d_ff=128, d_kv=16, num_layers=2, num_heads=4, vocab_size=128)),
            t5_inputs),
        "gpt_neox": _hf(lambda: tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            **small)), ids),
        "resnet18": _hf(lambda: torchvision.models.resnet18(num_classes=10),
                        lambda m: image(m, 64)),
        "vit_tiny": _hf(lambda: timm.create_model("vit_tiny_patch16_224", pretrained=False,
                                                  num_classes=10), lambda m: image(m, 224)),
    }


def record(device: str) -> dict[str, set[str]]:
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    seen: dict[str, set[str]] = {}
    for name, make in models().items():
        torch.manual_seed(0)
        model, inputs = make(device, dtype)
        for mode in ("eval", "train"):
            model.train(mode == "train")
            rec = Recorder()
            with torch.set_grad_enabled(mode == "train"), rec:
                args = list(inputs.values()) if "x" in inputs else []
                kwargs = {} if "x" in inputs else inputs
                model(*args, **kwargs)
            for op in rec.ops:
                seen.setdefault(op, set()).add(f"{name}/{device}/{mode}")
        print(f"{name}: done", file=sys.stderr)
    return seen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--merge", nargs="*", default=[], help="earlier outputs to merge in")
    a = ap.parse_args()
    ops = {k: set(v) for k, v in record(a.device).items()}
    for path in a.merge:
        with open(path) as f:
            for k, v in json.load(f)["ops"].items():
                ops.setdefault(k, set()).update(v)
    with open(a.out, "w") as f:
        json.dump({"torch": torch.__version__, "recorded_by": "tools/record_model_ops.py",
                   "ops": {k: sorted(v) for k, v in sorted(ops.items())}}, f, indent=1)
        f.write("\n")
    print(f"{len(ops)} ops -> {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
