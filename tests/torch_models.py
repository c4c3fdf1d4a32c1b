"""Small PyTorch modules with random weights: a ResNet-like and a BERT-like one, for tests/test_dynamo.py and
scripts/bench_dynamo.py (one definition). Imports torch: import it only where torch is installed."""
import torch

nn = torch.nn


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
