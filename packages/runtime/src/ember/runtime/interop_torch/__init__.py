"""ember <-> torch's compiler stack, the one place ember touches torch's compiler internals.

- `dynamo`: `torch.compile(model, backend="ember")`: TorchDynamo's FX graphs captured and
  compiled by ember (entry point group `torch_dynamo_backends`).
- `fx_export`: an ember aten graph as a torch.fx GraphModule.
- `inductor`: the IR backend `torch-inductor` (`ember.runtime.compile(m,
  backend="torch-inductor")`, `ember run --backend torch-inductor`): ember's capture, torch's
  inductor (entry point group `ember.backends`).

Nothing is imported here: each piece is loaded by its entry point when asked for.
See docs/interop.md.
"""
