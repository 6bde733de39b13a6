"""The model zoo of `benchmarks/zoo.py`: ~50 torchvision, timm and Hugging Face architectures.

Random weights (torchvision `weights=None`, timm `pretrained=False`, HF models built from config
classes with HF_HUB_OFFLINE=1: nothing downloads), eval mode, f32, batch 2. Images are 224×224
(timm: the model's own input size); HF text models take batch 2 × 128 tokens with small but
realistic configs (4 layers × 256 hidden, 4 heads, FFN 1024, vocab 8192). HF decoders are built
with `use_cache=False`: the compiled call is one forward pass (a prefill), compared on its logits.

`ZOO` is ordered so that a run cut short by its time budget is still informative: the families
(torchvision, timm, HF) and the kinds (CNN, transformer) alternate, and the heaviest compiles
(DenseNet, MaxViT, CaiT) come late.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

Built = tuple[Callable[..., Any], tuple[Any, ...]]


@dataclass(frozen=True)
class Size:
    """The sizes of the HF configs and inputs (`TINY`: the smoke test's)."""

    layers: int = 4
    hidden: int = 256
    heads: int = 4
    ffn: int = 1024
    vocab: int = 8192
    seq: int = 128
    batch: int = 2
    image: int = 224


FULL = Size()
TINY = Size(layers=1, hidden=64, heads=2, ffn=128, vocab=512, seq=16, batch=1, image=32)


@dataclass(frozen=True)
class Model:
    name: str
    family: str  # "torchvision", "timm" or "hf": also the library that must import
    kind: str  # "cnn", "transformer", "mlp", "hybrid"
    build: Callable[[Size], Built]
    what: str


class Keywords(nn.Module):
    """Calls `model(**dict(zip(names, args)))`: HF models whose inputs are not positional."""

    def __init__(self, model: nn.Module, *names: str):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args: torch.Tensor) -> Any:
        return self.model(**dict(zip(self.names, args)))


# ---- torchvision -------------------------------------------------------------------------------


def _tv(name: str, **kw: Any) -> Callable[[Size], Built]:
    def build(s: Size) -> Built:
        import torchvision
        m = torchvision.models.get_model(name, weights=None, **kw).eval()
        return m, (torch.randn(FULL.batch, 3, 224, 224),)
    return build


def tv(name: str, kind: str, what: str, **kw: Any) -> Model:
    return Model(f"tv/{name}", "torchvision", kind, _tv(name, **kw),
                 f"torchvision {name}: {what}")


# ---- timm --------------------------------------------------------------------------------------


def _timm(name: str) -> Callable[[Size], Built]:
    def build(s: Size) -> Built:
        import timm
        m = timm.create_model(name, pretrained=False).eval()
        size = tuple(m.pretrained_cfg.get("input_size", (3, 224, 224)))
        return m, (torch.randn(FULL.batch, *size),)
    return build


def tm(name: str, kind: str, what: str) -> Model:
    return Model(f"timm/{name}", "timm", kind, _timm(name), f"timm {name}: {what}")


# ---- Hugging Face ------------------------------------------------------------------------------


def _ids(s: Size) -> torch.Tensor:
    return torch.randint(0, s.vocab, (s.batch, s.seq))


def _mask(s: Size) -> torch.Tensor:
    """An attention mask with padding at the end of the second sequence."""
    m = torch.ones(s.batch, s.seq, dtype=torch.long)
    m[-1, s.seq * 3 // 4:] = 0
    return m


def _bert_like(cls_name: str, cfg_name: str, **extra: Any) -> Callable[[Size], Built]:
    """An encoder called with (input_ids, attention_mask)."""
    def build(s: Size) -> Built:
        import transformers
        cfg = getattr(transformers, cfg_name)(
            hidden_size=s.hidden, num_hidden_layers=s.layers, num_attention_heads=s.heads,
            intermediate_size=s.ffn, vocab_size=s.vocab, max_position_embeddings=512, **extra)
        m = getattr(transformers, cls_name)(cfg).eval()
        return Keywords(m, "input_ids", "attention_mask"), (_ids(s), _mask(s))
    return build


def _decoder(cls_name: str, cfg_name: str, **extra: Any) -> Callable[[Size], Built]:
    """A causal LM (Llama-style config field names) called with input_ids."""
    def build(s: Size) -> Built:
        import transformers
        kw: dict[str, Any] = dict(
            hidden_size=s.hidden, num_hidden_layers=s.layers, num_attention_heads=s.heads,
            intermediate_size=s.ffn, vocab_size=s.vocab, max_position_embeddings=512,
            use_cache=False)
        kw.update(extra)
        m = getattr(transformers, cls_name)(getattr(transformers, cfg_name)(**kw)).eval()
        return Keywords(m, "input_ids"), (_ids(s),)
    return build


def _gpt2(s: Size) -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_embd=s.hidden, n_layer=s.layers, n_head=s.heads, n_inner=s.ffn,
                     vocab_size=s.vocab, n_positions=512, use_cache=False, bos_token_id=0,
                     eos_token_id=0)
    return Keywords(GPT2LMHeadModel(cfg).eval(), "input_ids"), (_ids(s),)


def _distilbert(s: Size) -> Built:
    from transformers import DistilBertConfig, DistilBertModel
    cfg = DistilBertConfig(dim=s.hidden, n_layers=s.layers, n_heads=s.heads, hidden_dim=s.ffn,
                           vocab_size=s.vocab)
    return Keywords(DistilBertModel(cfg).eval(), "input_ids", "attention_mask"), \
        (_ids(s), _mask(s))


def _albert(s: Size) -> Built:
    from transformers import AlbertConfig, AlbertModel
    cfg = AlbertConfig(embedding_size=128, hidden_size=s.hidden, num_hidden_layers=s.layers,
                       num_attention_heads=s.heads, intermediate_size=s.ffn, vocab_size=s.vocab)
    return Keywords(AlbertModel(cfg).eval(), "input_ids", "attention_mask"), (_ids(s), _mask(s))


def _opt(s: Size) -> Built:
    from transformers import OPTConfig, OPTForCausalLM
    cfg = OPTConfig(hidden_size=s.hidden, num_hidden_layers=s.layers, num_attention_heads=s.heads,
                    ffn_dim=s.ffn, vocab_size=s.vocab, word_embed_proj_dim=s.hidden,
                    max_position_embeddings=512, use_cache=False)
    return Keywords(OPTForCausalLM(cfg).eval(), "input_ids"), (_ids(s),)


def _bloom(s: Size) -> Built:
    from transformers import BloomConfig, BloomForCausalLM
    cfg = BloomConfig(hidden_size=s.hidden, n_layer=s.layers, n_head=s.heads,
                      vocab_size=s.vocab, use_cache=False)
    return Keywords(BloomForCausalLM(cfg).eval(), "input_ids", "attention_mask"), \
        (_ids(s), _mask(s))


def _neox(s: Size) -> Built:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    cfg = GPTNeoXConfig(hidden_size=s.hidden, num_hidden_layers=s.layers,
                        num_attention_heads=s.heads, intermediate_size=s.ffn, vocab_size=s.vocab,
                        max_position_embeddings=512, rotary_pct=0.25, use_parallel_residual=True,
                        use_cache=False)
    return Keywords(GPTNeoXForCausalLM(cfg).eval(), "input_ids"), (_ids(s),)


def _bart(s: Size) -> Built:
    from transformers import BartConfig, BartModel
    cfg = BartConfig(d_model=s.hidden, encoder_layers=s.layers // 2 or 1,
                     decoder_layers=s.layers // 2 or 1, encoder_attention_heads=s.heads,
                     decoder_attention_heads=s.heads, encoder_ffn_dim=s.ffn,
                     decoder_ffn_dim=s.ffn, vocab_size=s.vocab, max_position_embeddings=512,
                     use_cache=False)
    return Keywords(BartModel(cfg).eval(), "input_ids", "attention_mask"), (_ids(s), _mask(s))


def _t5_encoder(s: Size) -> Built:
    from transformers import T5Config, T5EncoderModel
    cfg = T5Config(d_model=s.hidden, d_kv=s.hidden // s.heads, d_ff=s.ffn, num_layers=s.layers,
                   num_heads=s.heads, vocab_size=s.vocab)
    return Keywords(T5EncoderModel(cfg).eval(), "input_ids", "attention_mask"), \
        (_ids(s), _mask(s))


def _vit_hf(s: Size) -> Built:
    from transformers import ViTConfig, ViTModel
    cfg = ViTConfig(hidden_size=s.hidden, num_hidden_layers=s.layers,
                    num_attention_heads=s.heads, intermediate_size=s.ffn, image_size=s.image,
                    patch_size=16)
    return ViTModel(cfg, add_pooling_layer=False).eval(), \
        (torch.randn(s.batch, 3, s.image, s.image),)


def _clip_vision(s: Size) -> Built:
    from transformers import CLIPVisionConfig, CLIPVisionModel
    cfg = CLIPVisionConfig(hidden_size=s.hidden, num_hidden_layers=s.layers,
                           num_attention_heads=s.heads, intermediate_size=s.ffn,
                           image_size=s.image, patch_size=16)
    return CLIPVisionModel(cfg).eval(), (torch.randn(s.batch, 3, s.image, s.image),)


def _whisper_encoder(s: Size) -> Built:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    frames = 4 * s.seq  # the encoder wants exactly 2 × max_source_positions mel frames
    cfg = WhisperConfig(d_model=s.hidden, encoder_layers=s.layers,
                        encoder_attention_heads=s.heads, encoder_ffn_dim=s.ffn, num_mel_bins=80,
                        max_source_positions=frames // 2, vocab_size=s.vocab, pad_token_id=0,
                        bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    return WhisperEncoder(cfg).eval(), (torch.randn(s.batch, 80, frames),)


def _wav2vec2(s: Size) -> Built:
    from transformers import Wav2Vec2Config, Wav2Vec2Model
    cfg = Wav2Vec2Config(hidden_size=s.hidden, num_hidden_layers=s.layers,
                         num_attention_heads=s.heads, intermediate_size=s.ffn,
                         num_conv_pos_embeddings=32, num_conv_pos_embedding_groups=4)
    return Wav2Vec2Model(cfg).eval(), (torch.randn(s.batch, 125 * s.seq),)


def hf(name: str, kind: str, build: Callable[[Size], Built], what: str) -> Model:
    return Model(f"hf/{name}", "hf", kind, build, f"transformers {what}")


_TEXT = "4 layers × 256, 4 heads, FFN 1024, vocab 8192; batch 2 × 128 tokens"
_DEC = "4 layers × 256, 4 heads, FFN 1024, vocab 8192, use_cache=False; batch 2 × 128 tokens"

TORCHVISION = [
    tv("resnet18", "cnn", "basic blocks, BatchNorm"),
    tv("mobilenet_v2", "cnn", "inverted residuals, depthwise convolutions, ReLU6"),
    tv("vit_b_16", "transformer", "ViT-B/16, 12 layers × 768"),
    tv("resnet50", "cnn", "bottleneck blocks"),
    tv("efficientnet_b0", "cnn", "MBConv, squeeze-excitation, SiLU, stochastic depth (eval)"),
    tv("convnext_tiny", "cnn", "7×7 depthwise convs, LayerNorm, GELU, layer scale"),
    tv("swin_t", "transformer", "shifted windows, relative position bias"),
    tv("squeezenet1_1", "cnn", "fire modules, concat"),
    tv("mobilenet_v3_large", "cnn", "hardswish, squeeze-excitation"),
    tv("shufflenet_v2_x1_0", "cnn", "channel shuffle, chunk, concat"),
    tv("regnet_y_400mf", "cnn", "group convs, squeeze-excitation"),
    tv("vgg11", "cnn", "plain 3×3 convs, big Linear layers"),
    tv("resnext50_32x4d", "cnn", "grouped bottlenecks"),
    tv("mnasnet1_0", "cnn", "NAS blocks"),
    tv("googlenet", "cnn", "inception blocks (no aux heads)", aux_logits=False,
       init_weights=True),
    tv("alexnet", "cnn", "5 convs, adaptive pool, dropout (eval)"),
    tv("densenet121", "cnn", "dense blocks: many concats"),
    tv("maxvit_t", "hybrid", "MBConv + block/grid attention"),
]

TIMM = [
    tm("deit_tiny_patch16_224", "transformer", "DeiT-Ti"),
    tm("resnest14d", "cnn", "split attention"),
    tm("levit_128s", "hybrid", "conv stem, attention with BN, hardswish"),
    tm("mixer_s16_224", "mlp", "MLP-Mixer S/16"),
    tm("ghostnet_100", "cnn", "ghost modules"),
    tm("efficientformer_l1", "hybrid", "pooling mixers + a final attention stage"),
    tm("poolformer_s12", "cnn", "average-pool token mixer, GroupNorm"),
    tm("mobilevit_xs", "hybrid", "MobileViT: unfold/fold around transformers"),
    tm("rexnet_100", "cnn", "ReXNet: SiLU, SE, partial residuals"),
    tm("dla34", "cnn", "deep layer aggregation trees"),
    tm("edgenext_xx_small", "hybrid", "split depthwise transposed attention"),
    tm("cait_xxs24_224", "transformer", "CaiT: talking heads, class attention, 24 layers"),
]

HF = [
    hf("bert", "transformer", _bert_like("BertModel", "BertConfig"), f"BertModel, {_TEXT}"),
    hf("gpt2", "transformer", _gpt2, f"GPT2LMHeadModel, {_DEC}"),
    hf("llama", "transformer",
       _decoder("LlamaForCausalLM", "LlamaConfig", num_key_value_heads=2),
       f"LlamaForCausalLM (GQA 4:2 heads, RMSNorm, SwiGLU, rotary), {_DEC}"),
    hf("t5-encoder", "transformer", _t5_encoder, f"T5EncoderModel (relative bias), {_TEXT}"),
    hf("vit", "transformer", _vit_hf, "ViTModel, 4 layers × 256, patch 16; batch 2 × 224²"),
    hf("distilbert", "transformer", _distilbert, f"DistilBertModel, {_TEXT}"),
    hf("gpt-neox", "transformer", _neox, f"GPTNeoXForCausalLM (rotary_pct 0.25), {_DEC}"),
    hf("whisper-encoder", "transformer", _whisper_encoder,
       "WhisperEncoder (conv stem), 4 layers × 256; batch 2 × 80 mels × 512 frames"),
    hf("roberta", "transformer", _bert_like("RobertaModel", "RobertaConfig"),
       f"RobertaModel, {_TEXT}"),
    hf("mistral", "transformer",
       _decoder("MistralForCausalLM", "MistralConfig", num_key_value_heads=2,
                sliding_window=64),
       f"MistralForCausalLM (GQA, sliding window 64), {_DEC}"),
    hf("albert", "transformer", _albert, f"AlbertModel (shared layers), {_TEXT}"),
    hf("qwen2", "transformer",
       _decoder("Qwen2ForCausalLM", "Qwen2Config", num_key_value_heads=2),
       f"Qwen2ForCausalLM (QKV bias, GQA), {_DEC}"),
    hf("bart", "transformer", _bart,
       "BartModel, 2 encoder + 2 decoder layers × 256; batch 2 × 128 tokens"),
    hf("opt", "transformer", _opt, f"OPTForCausalLM, {_DEC}"),
    hf("phi", "transformer", _decoder("PhiForCausalLM", "PhiConfig", partial_rotary_factor=0.5),
       f"PhiForCausalLM (parallel attention/MLP, partial rotary), {_DEC}"),
    hf("electra", "transformer", _bert_like("ElectraModel", "ElectraConfig", embedding_size=128),
       f"ElectraModel (embedding projection), {_TEXT}"),
    hf("gemma", "transformer",
       _decoder("GemmaForCausalLM", "GemmaConfig", num_key_value_heads=1, head_dim=64),
       f"GemmaForCausalLM (MQA, GeGLU, scaled embeddings), {_DEC}"),
    hf("clip-vision", "transformer", _clip_vision,
       "CLIPVisionModel (quick_gelu), 4 layers × 256, patch 16; batch 2 × 224²"),
    hf("bloom", "transformer", _bloom, f"BloomForCausalLM (ALiBi), {_DEC}"),
    hf("deberta-v2", "transformer", _bert_like("DebertaV2Model", "DebertaV2Config"),
       f"DebertaV2Model (disentangled attention), {_TEXT}"),
    hf("wav2vec2", "hybrid", _wav2vec2,
       "Wav2Vec2Model: 7-conv feature extractor + 4 layers × 256; batch 2 × 16000 samples"),
    hf("mobilebert", "transformer",
       _bert_like("MobileBertModel", "MobileBertConfig", embedding_size=128,
                  intra_bottleneck_size=128, true_hidden_size=128),
       f"MobileBertModel (bottlenecks, NoNorm), {_TEXT}"),
    # Mixture of experts: transformers' experts run as grouped matmuls over tokens sorted by
    # expert (torch.histc counts them; on the CPU in f32, a custom op of transformers' own)
    hf("mixtral", "transformer",
       _decoder("MixtralForCausalLM", "MixtralConfig", num_key_value_heads=2,
                num_local_experts=4, num_experts_per_tok=2),
       f"MixtralForCausalLM (MoE: 4 experts, top-2, GQA), {_DEC}"),
    hf("qwen2-moe", "transformer",
       _decoder("Qwen2MoeForCausalLM", "Qwen2MoeConfig", num_key_value_heads=2, num_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=512,
                shared_expert_intermediate_size=1024),
       f"Qwen2MoeForCausalLM (MoE: 4 experts, top-2, a gated shared expert), {_DEC}"),
]


def _interleave(*lists: list[Model]) -> list[Model]:
    out: list[Model] = []
    for i in range(max(len(x) for x in lists)):
        out += [x[i] for x in lists if i < len(x)]
    return out


ZOO: list[Model] = _interleave(TORCHVISION, HF, TIMM)
BY_NAME: dict[str, Model] = {m.name: m for m in ZOO}

# The CUDA suite's model set (benchmarks/gpu_cuda_suite.py `--models zoo30`, issue 16 item 6):
# 30 of the zoo's models, cast to bf16 there — every kind and family, the CNN ops that matter on
# the GPU (depthwise, grouped and 7×7 convolutions, squeeze-excitation, shuffles) and the HF
# attention variants (GQA, MQA, ALiBi, parallel attention, relative bias, cross attention),
# leaving out the zoo's slowest compiles (DenseNet, MaxViT, Swin, CaiT). The first ten are the
# models the suite measured before (in that order, so earlier runs stay comparable).
CUDA30: list[str] = [
    "hf/llama", "hf/gpt2", "hf/bert", "tv/resnet18", "timm/deit_tiny_patch16_224",
    "hf/gpt-neox", "timm/mixer_s16_224", "hf/vit", "tv/mobilenet_v2", "hf/qwen2",
    "tv/resnet50", "hf/t5-encoder", "timm/resnest14d", "tv/efficientnet_b0", "hf/mistral",
    "timm/levit_128s", "tv/convnext_tiny", "hf/phi", "timm/ghostnet_100",
    "tv/mobilenet_v3_large", "hf/bloom", "timm/poolformer_s12", "tv/regnet_y_400mf",
    "hf/gemma", "timm/edgenext_xx_small", "tv/shufflenet_v2_x1_0", "hf/whisper-encoder",
    "tv/vit_b_16", "hf/bart", "hf/deberta-v2",
]
