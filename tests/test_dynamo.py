"""roller.models.dynamo: torch.compile(model, backend="roller") on small ResNet- and BERT-like modules (random
weights), and the eager fallback for a graph TVM's from_fx does not import. Skipped where torch does not import
(it is not a dependency of roller: CI installs it into a folder of its own, see .ci/run)."""
import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (optional: pip install 'roller[torch]')")
nn = torch.nn
from torch_models import TinyBert, TinyResNet  # noqa: E402 (after the skip: it imports torch)

pytestmark = pytest.mark.build

TOL = 1e-3  # relative to the output's scale, as roller.models.frontend.MODEL_TOLERANCE for float32


def close(ours, eager):
    assert isinstance(ours, torch.Tensor) and ours.shape == eager.shape and ours.dtype == eager.dtype
    err = (ours - eager).abs().max().item()
    assert err <= TOL * eager.abs().max().item(), (err, eager.abs().max().item())


class Unsupported(nn.Module):
    def forward(self, x):
        return torch.special.bessel_j0(x) + 1


def roller_warnings(record):
    return [w for w in record if str(w.message).startswith("roller:")]


def compiled(model, x):
    import roller.models.dynamo as rd

    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fast = rd.compile(model, (x,))
        with torch.no_grad():
            ours = fast(x)
    return ours, roller_warnings(record)


@pytest.mark.parametrize("make,shape", [(TinyResNet, (2, 3, 32, 32)), (TinyBert, (2, 16, 32))],
                         ids=["resnet", "bert"])
def test_dynamo_matches_eager(make, shape):
    torch.manual_seed(0)
    model = make().eval()
    for m in model.modules():  # non-trivial running statistics, so that batch norm does something
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(*shape)
    ours, warned = compiled(model, x)
    assert not warned, [str(w.message) for w in warned]
    with torch.no_grad():
        close(ours, model(x))
        x2 = torch.randn(*shape)
        close(torch.compile(model, backend="roller", dynamic=False)(x2), model(x2))


def test_dynamo_unsupported_op_falls_back_once():
    x = torch.randn(4, 8)
    ours, warned = compiled(Unsupported(), x)
    assert len(warned) == 1 and "from_fx" in str(warned[0].message), [str(w.message) for w in warned]
    assert torch.equal(ours, Unsupported()(x))


def test_batch_norms_fold_into_convolutions():
    """Every eval batch norm after a convolution is folded into its weight and bias before from_fx (else Relax
    fuses it apart from the convolution: one more pass over every activation), and the graph still computes
    eager's output."""
    import roller.models.dynamo as rd

    torch.manual_seed(0)
    model = TinyResNet().eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    x = torch.randn(2, 3, 32, 32)
    seen = {}

    def backend(gm, example_inputs):
        frozen, keep = rd._freeze_weights(gm, list(example_inputs))
        seen["folded"] = rd._fold_batch_norms(frozen)
        seen["left"] = [n for n in frozen.graph.nodes if n.target is nn.functional.batch_norm]
        seen["out"] = frozen(*[example_inputs[i] for i in keep])
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=False)(x)
        expected = model(x)
    assert seen["folded"] == 3 and not seen["left"]
    out = seen["out"][0] if isinstance(seen["out"], (tuple, list)) else seen["out"]
    close(out, expected)


def test_hardtanh_bounds_from_positional_arguments():
    """nn.ReLU6 and nn.Hardtanh reach the backend as hardtanh(x, min, max) with positional bounds, which TVM
    0.27's from_fx ignored (clip to [-1, 1]: MobileNetV2 came out 34x its scale off)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU6(), nn.Conv2d(8, 8, 1), nn.Hardtanh(-2.0, 3.0)).eval()
    x = 4 * torch.randn(1, 3, 16, 16)
    ours, warned = compiled(model, x)
    assert not warned, [str(w.message) for w in warned]
    with torch.no_grad():
        close(ours, model(x))


def test_relu6_stays_a_convolution_epilogue():
    """hardtanh becomes maximum then minimum, which the NHWC layout conversion sees through (relax.clip it
    does not: ReLU6 ran as a function of its own between two transposes), so each convolution's function
    carries its ReLU6 and nothing is transposed between them."""
    from roller.models.dynamo import roller_backend

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU6(), nn.Conv2d(16, 16, 1), nn.ReLU6()).eval()
    x = 4 * torch.randn(1, 3, 16, 16)
    runs = []

    def backend(gm, example_inputs):
        runs.append(roller_backend(gm, example_inputs))
        return runs[-1]

    with torch.no_grad():
        close(torch.compile(model, backend=backend, dynamic=False)(x), model(x))
    names = [r.name for r in runs[0].compiled_model.report]
    convs = [n for n in names if "conv2d" in n]
    assert len(convs) == 2 and all("maximum" in n and "minimum" in n for n in convs), names
    assert sum("transpose" in n for n in names) <= 2, names  # the input's and the output's layout only
