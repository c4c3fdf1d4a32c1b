"""roller.models.dynamo: torch.compile(model, backend="roller") on small ResNet- and BERT-like modules (random
weights), and the eager fallback for a graph TVM's from_fx does not import. Skipped where torch does not import
(it is not a dependency of roller: CI installs it into a folder of its own, see .ci/run)."""
import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (optional: pip install 'roller[torch]')")
nn = torch.nn

pytestmark = pytest.mark.build

TOL = 1e-3  # relative to the output's scale, as roller.models.frontend.MODEL_TOLERANCE for float32


def close(ours, eager):
    assert isinstance(ours, torch.Tensor) and ours.shape == eager.shape and ours.dtype == eager.dtype
    err = (ours - eager).abs().max().item()
    assert err <= TOL * eager.abs().max().item(), (err, eager.abs().max().item())


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


class TinyResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(2)
        self.block = Block(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        y = self.pool(torch.relu(self.bn(self.stem(x))))
        y = self.block(y)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


class TinyBert(nn.Module):
    def __init__(self, d=32, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff1, self.ff2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        # chunk, not `q, k, v = tensor` (TVM 0.27's from_fx mis-imports unpacking a tensor: it falls back)
        q, k, v = (p.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for p in self.qkv(x).chunk(3, -1))
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        y = self.ln1(x + self.out((att @ v).transpose(1, 2).reshape(b, t, d)))
        return self.ln2(y + self.ff2(nn.functional.gelu(self.ff1(y))))


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
