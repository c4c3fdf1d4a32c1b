"""Common architectures as ONNX files (random weights, nothing downloaded), for ``roller compile``.

    python3 scripts/export_models.py --list
    PYTHONPATH=/work/torchenv python3 scripts/export_models.py /work/models
    PYTHONPATH=/work/torchenv python3 scripts/export_models.py /work/models --models resnet50,gpt2

    PYTHONPATH=/work/torchenv python3 scripts/export_models.py /work/models --batch 8   # NAME_b8.onnx
    PYTHONPATH=/work/torchenv python3 scripts/export_models.py /work/models/more --models squeezenet1_0
    PYTHONPATH=/work/torchenv python3 scripts/export_models.py /work/models --all        # MORE_VISION too

Builds, with ``torch.onnx.export(..., dynamo=False)`` (the TorchScript exporter), opset 17, batch 1 (or
``--batch N``, written as NAME_bN.onnx): torchvision classifiers at 224x224 (``weights=None``: random
weights, input ``x`` Nx3x224x224) and Hugging Face encoders/decoders from their default configurations
with random weights (input ``input_ids`` Nx128, int64; the output is the last hidden state). The Hugging Face models keep ``--layers`` transformer
layers (default 2, through the configuration: ``num_hidden_layers``, ``n_layers`` or ``n_layer``) so the
export and the compile stay short; every other setting is the configuration's default.

PyTorch, torchvision, transformers and Pillow are not roller's dependencies: install them into a folder
of their own (``pip install --target /work/torchenv ...``) and put it on PYTHONPATH for this step only
(an importable torch makes ``import tvm`` import it). torchvision from PyPI cannot load its compiled
operators against the CPU build of torch; the classifiers need none, so its two registration modules
are replaced with empty ones before the import (see TVM-NOTES, "Whole-model peers and model sources").
"""
from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

IMAGE = (3, 224, 224)  # after the batch dimension
SEQ = 128
OPSET = 17

VISION = ["resnet50", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0", "regnet_y_400mf",
          "shufflenet_v2_x1_0", "convnext_tiny", "vit_b_16", "swin_t"]
# the other torchvision families, exported when named (--models or --all): the sweep of docs/models.md,
# "The other torchvision families"
MORE_VISION = ["squeezenet1_0", "densenet121", "googlenet", "inception_v3", "mnasnet1_0", "resnext50_32x4d",
               "wide_resnet50_2", "efficientnet_v2_s", "maxvit_t", "regnet_x_400mf", "swin_v2_t", "alexnet",
               "vgg11_bn", "shufflenet_v2_x0_5", "vit_b_32"]
# name -> (config class, model class, the configuration's layer-count field, pass an all-ones attention mask):
# GPT-2 without a mask looks for packed sequences in its position ids with torch.diff, which the
# TorchScript exporter cannot write (aten::diff)
TEXT = {
    "bert_base": ("BertConfig", "BertModel", "num_hidden_layers", False),
    "distilbert": ("DistilBertConfig", "DistilBertModel", "n_layers", False),
    "roberta_base": ("RobertaConfig", "RobertaModel", "num_hidden_layers", False),
    "gpt2": ("GPT2Config", "GPT2Model", "n_layer", True),
}
DEFAULT = VISION + list(TEXT)
MODELS = VISION + MORE_VISION + list(TEXT)


class MissingDependency(Exception):
    pass


def import_torch():
    try:
        import torch
    except ImportError as e:
        raise MissingDependency(f"needs PyTorch ({e}): install it with pip install --target DIR torch and run "
                                f"with PYTHONPATH=DIR") from None
    return torch


def _stub_torchvision_operators():
    """torchvision's compiled operators (nms, roi_align...) do not load against the CPU build of torch; the
    classifiers use none of them, and these two modules are what registers them at import. transformers
    imports torchvision too where it is installed, so the text models need this as well."""
    for name in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
        sys.modules.setdefault(name, types.ModuleType(name))


def import_torchvision():
    _stub_torchvision_operators()
    try:
        import torchvision.models
    except ImportError as e:
        raise MissingDependency(f"needs torchvision and Pillow ({e}): pip install --target DIR --no-deps "
                                f"torchvision pillow") from None
    return torchvision.models


def _import_transformers():
    _stub_torchvision_operators()  # (a text-only export failed: "Could not import module 'BertModel'")
    try:
        import transformers
    except ImportError as e:
        raise MissingDependency(f"needs transformers ({e}): pip install --target DIR transformers") from None
    return transformers


def _vision(name: str, batch: int):
    torch = import_torch()
    tvm_models = import_torchvision()
    model = getattr(tvm_models, name)(weights=None).eval()
    return model, (torch.randn(batch, *IMAGE),), ["x"]


def _text(name: str, layers: int, batch: int):
    torch = import_torch()
    tf = _import_transformers()
    config_cls, model_cls, layer_field, mask = TEXT[name]
    config = getattr(tf, config_cls)()
    setattr(config, layer_field, layers)
    config.use_cache = False
    model = getattr(tf, model_cls)(config)
    if hasattr(model, "set_attn_implementation"):
        try:
            model.set_attn_implementation("eager")  # plain matmul-softmax attention, not SDPA
        except Exception:  # older transformers: the config's choice stays
            pass
    model.eval()

    class LastHidden(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids):
            extra = {"attention_mask": torch.ones_like(input_ids)} if mask else {}
            return self.inner(input_ids=input_ids, return_dict=True, **extra).last_hidden_state

    ids = torch.randint(0, config.vocab_size, (batch, SEQ), dtype=torch.int64)
    return LastHidden(model), (ids,), ["input_ids"]


def build(name: str, layers: int = 2, batch: int = 1):
    """The model ``name`` (eval mode, random weights from seed 0), its example inputs and their names, as
    exported; also scripts/bench_dynamo.py's models."""
    torch = import_torch()
    torch.manual_seed(0)
    # nn.MultiheadAttention's inference fast path is one aten::_native_multi_head_attention call, which
    # the TorchScript exporter cannot write (vit_b_16): the plain path exports as MatMul/Softmax
    if hasattr(torch.backends, "mha"):
        torch.backends.mha.set_fastpath_enabled(False)
    model, args, inputs = _text(name, layers, batch) if name in TEXT else _vision(name, batch)
    with torch.no_grad():  # a weight its initializer leaves all zeros (ViT's classifier head) would make the
        for p in model.parameters():  # output a constant and any comparison of outputs vacuous
            if p.dim() >= 2 and not p.any():
                p.normal_(0.0, 0.02)
    return model, args, inputs


def write_onnx(model, args, inputs, f) -> None:
    """``model`` on ``args`` as ONNX into ``f`` (a path or a binary file): the TorchScript exporter, OPSET."""
    torch = import_torch()
    with torch.no_grad():
        torch.onnx.export(model, args, f, input_names=inputs, output_names=["y"], opset_version=OPSET,
                          dynamo=False, do_constant_folding=True)


def export(name: str, out: Path, layers: int, batch: int = 1) -> Path:
    model, args, inputs = build(name, layers, batch)
    path = out / (f"{name}.onnx" if batch == 1 else f"{name}_b{batch}.onnx")
    write_onnx(model, args, inputs, str(path))
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", help="folder the .onnx files are written to")
    p.add_argument("--models", default=",".join(DEFAULT), help="comma-separated (default: the issue's "
                   "architectures, " + ",".join(DEFAULT) + "); also " + ",".join(MORE_VISION))
    p.add_argument("--all", action="store_true", help="every model this script knows")
    p.add_argument("--layers", type=int, default=2, help="transformer layers of the Hugging Face models (default 2)")
    p.add_argument("--batch", type=int, default=1, help="the batch dimension (default 1; other sizes are "
                   "written as NAME_bN.onnx beside the batch-1 file)")
    p.add_argument("--list", action="store_true", help="print the model names and exit")
    args = p.parse_args(argv)
    if args.list:
        for n in MODELS:
            print(f"{n}\t{'transformers' if n in TEXT else 'torchvision'}")
        return 0
    if not args.out:
        p.error("give the output folder (or --list)")
    if args.batch < 1:
        p.error(f"--batch takes a positive batch size, not {args.batch}")
    names = MODELS if args.all else [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    out = Path(args.out)
    try:
        import_torch()
        out.mkdir(parents=True, exist_ok=True)
        import warnings

        warnings.filterwarnings("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        failed = []
        for n in names:
            t = time.perf_counter()
            try:
                path = export(n, out, args.layers, args.batch)
            except MissingDependency:
                raise
            except Exception as e:  # one model's exporter failure: say which and why, export the others
                failed.append(n)
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                print(f"{n}: export failed: {type(e).__name__}: {first[:300]}", flush=True)
                continue
            print(f"{n}: {path} ({path.stat().st_size / 2**20:.1f} MiB, {time.perf_counter() - t:.1f} s)", flush=True)
    except MissingDependency as e:
        print(f"export_models: {e}", file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
