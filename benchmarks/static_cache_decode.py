"""A static-cache decode step on the CPU, compiled with and without `cache-inplace`.

`.venv/bin/python benchmarks/static_cache_decode.py [--hidden 512 --layers 8 --cache 2048]`

A random-weight Llama (transformers, 8 heads, 4 key/value heads) generates 3 tokens greedily
with a `StaticCache` of `--cache` rows; its last decode step's arguments are kept and the
step is called through two compiled forwards: compile()'s default pipeline (`cache-inplace`
first in inductor-cpu: each layer's new key/value rows written into the cache by index_copy_)
and the same pipeline without the pass (each cache cloned for the scatter, the result copied
back by the runtime); eager for scale. One thread, thread CPU time, interleaved (order alternating), medians;
the cache's position is rewound after each call. Logits are checked against eager's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

import ember.runtime as er
from ember.ir.passes import expand_pipeline


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--cache", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    import transformers as T
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = T.LlamaConfig(hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=8,
                        num_key_value_heads=4, intermediate_size=2 * a.hidden, vocab_size=1000,
                        max_position_embeddings=a.cache)
    m = T.LlamaForCausalLM(cfg).eval()
    steps: list[tuple[Any, dict[str, Any]]] = []
    real = m.forward

    def spy(*args: Any, **kw: Any) -> Any:
        steps.append((args, dict(kw)))
        return real(*args, **kw)
    m.forward = spy
    with torch.no_grad():
        m.generate(torch.randint(2, 1000, (1, 8)), max_new_tokens=3, do_sample=False,
                   pad_token_id=0, past_key_values=T.StaticCache(config=cfg,
                                                                 max_cache_len=a.cache))
    del m.forward
    args, kw = steps[-1]
    cache: Any = kw.get("past_key_values", kw.get("cache"))

    def rewind() -> None:  # the step's own slot again
        for layer in cache.layers:
            layer.cumulative_length.sub_(1)
    rewind()
    default = expand_pipeline("inductor")
    without = default.replace("cache-inplace,dce,", "")
    assert without != default, default
    fns = {"in place": er.compile(m.forward),
           "copied": er.compile(m.forward, options={"pipeline": without}), "eager": real}
    times: dict[str, list[float]] = {k: [] for k in fns}
    with torch.no_grad():
        want = real(*args, **kw).logits
        rewind()
        for f in fns.values():
            for _ in range(3):
                got = f(*args, **kw).logits
                rewind()
            torch.testing.assert_close(got, want)
        for r in range(a.reps):
            for name in (list(fns) if r % 2 else list(fns)[::-1]):
                t = time.thread_time()
                fns[name](*args, **kw)
                times[name].append(time.thread_time() - t)
                rewind()
    print(f"Llama {a.layers} layers x {a.hidden}, static cache of {a.cache} rows, 1 thread, "
          f"thread CPU time, median of {a.reps}")
    for name, ts in times.items():
        print(f"  {name:9s} {statistics.median(ts) * 1e3:8.3f} ms per decode step")


if __name__ == "__main__":
    main()
