"""Models by name for the training runs: an MLP, CIFAR and ImageNet ResNets, a seq2seq Transformer."""

import dataclasses
import inspect
import math
from collections.abc import Sequence
from typing import Any, Callable, Literal, get_args

import torch
from torch import nn

from .datasets import PAD, DataSpec

__all__ = [
    "MLP",
    "MODELS",
    "MODEL_NAMES",
    "ModelEntry",
    "ModelName",
    "Seq2SeqTransformer",
    "build_model",
    "compatible_models",
    "resnet18",
    "resnet20",
    "resnet50",
    "transformer_base",
]


class MLP(nn.Sequential):
    """A ReLU multilayer perceptron on flattened inputs.

    Args:
        in_features: the number of input features (any input is flattened
            after the batch dimension).
        num_classes: the number of output logits.
        hidden: the width of each hidden layer, first to last; default two of 128.
    """

    def __init__(self, in_features: int, num_classes: int, hidden: Sequence[int] = (128, 128)) -> None:
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        super().__init__(*layers, nn.Linear(width, num_classes))


def _conv_bn(in_channels, out_channels, kernel_size, stride=1):
    """A bias-free convolution that keeps the spatial size (at stride 1), then BatchNorm."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size, stride, kernel_size // 2, bias=False),
        nn.BatchNorm2d(out_channels),
    )


class _Residual(nn.Module):
    """``relu(branch(x) + shortcut(x))``; the shortcut is a 1x1 convolution with
    BatchNorm (option B of He et al.) where the branch changes the shape, else the identity."""

    def __init__(self, branch, in_channels, out_channels, stride):
        super().__init__()
        self.out_channels = out_channels
        self.branch = branch
        self.shortcut = (
            _conv_bn(in_channels, out_channels, 1, stride)
            if stride != 1 or in_channels != out_channels
            else nn.Identity()
        )

    def forward(self, x):
        return torch.relu(self.branch(x) + self.shortcut(x))


def _basic_block(in_channels, channels, stride):
    """Two 3x3 convolutions (the first one strided); ``channels`` out."""
    branch = nn.Sequential(_conv_bn(in_channels, channels, 3, stride), nn.ReLU(), _conv_bn(channels, channels, 3))
    return _Residual(branch, in_channels, channels, stride)


def _bottleneck(in_channels, channels, stride):
    """1x1 down to ``channels``, 3x3 (strided: ResNet v1.5), 1x1 up to ``4 * channels``."""
    branch = nn.Sequential(
        _conv_bn(in_channels, channels, 1),
        nn.ReLU(),
        _conv_bn(channels, channels, 3, stride),
        nn.ReLU(),
        _conv_bn(channels, 4 * channels, 1),
    )
    return _Residual(branch, in_channels, 4 * channels, stride)


def _stage(block, in_channels, channels, blocks, stride):
    """``blocks`` residual blocks, the first one strided; returns the stage and its output channels."""
    layers = []
    for i in range(blocks):
        layers.append(block(in_channels, channels, stride if i == 0 else 1))
        in_channels = layers[-1].out_channels
    return nn.Sequential(*layers), in_channels


class _ResNet(nn.Sequential):
    """A stem, residual stages, global average pooling and a linear classifier.

    Convolutions are initialised as in He et al. 2015 (normal, fan-out, ReLU
    gain); BatchNorm and the classifier keep torch's defaults.  The global
    pooling is adaptive, so any input size the stem and strides leave at
    least 1x1 works.
    """

    def __init__(self, stem, stem_channels, block, stages, num_classes):
        layers, channels = [stem], stem_channels
        for i, (width, blocks) in enumerate(stages):
            stage, channels = _stage(block, channels, width, blocks, 1 if i == 0 else 2)
            layers.append(stage)
        super().__init__(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes))
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")


def resnet20(num_classes: int = 10) -> nn.Sequential:
    """ResNet-20 for CIFAR (He et al. 2016, section 4.2): a 3x3 convolution to
    16 channels, then 3 stages of 3 basic blocks with 16, 32 and 64 channels
    (stride 2 into stages 2 and 3), global pooling, one linear layer.

    Where the shape changes the shortcut is a 1x1 convolution with BatchNorm
    (option B; the paper's CIFAR nets use option A, zero-padded identity), so
    the net has 272,474 parameters with 10 classes instead of the paper's 0.27M
    (269,722).  Made for 3x32x32 inputs; larger ones work (adaptive pooling).
    """
    stem = nn.Sequential(_conv_bn(3, 16, 3), nn.ReLU())
    return _ResNet(stem, 16, _basic_block, [(16, 3), (32, 3), (64, 3)], num_classes)


def _imagenet_resnet(block, blocks, num_classes):
    """A 7x7/2 convolution to 64 channels and a 3x3/2 max-pool, then four stages of 64 to 512 base channels."""
    stem = nn.Sequential(_conv_bn(3, 64, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
    return _ResNet(stem, 64, block, list(zip((64, 128, 256, 512), blocks)), num_classes)


def resnet18(num_classes: int = 1000) -> nn.Sequential:
    """ImageNet ResNet-18 (He et al. 2016): basic blocks [2, 2, 2, 2], 1x1
    projection shortcuts where the shape changes; 11,689,512 parameters with
    1000 classes.  Made for 3x224x224 inputs; smaller ones down to 32x32 work
    (adaptive pooling)."""
    return _imagenet_resnet(_basic_block, (2, 2, 2, 2), num_classes)


def resnet50(num_classes: int = 1000) -> nn.Sequential:
    """ImageNet ResNet-50 v1.5: bottleneck blocks [3, 4, 6, 3] with the
    stride on the 3x3 convolution (v1 puts it on the first 1x1), 1x1
    projection shortcuts where the shape changes; 25,557,032 parameters with
    1000 classes.  (The WAGMA-SGD paper's 25,559,081 counts the TensorFlow v1
    model, which has 1001 outputs and biased convolutions.)  Made for
    3x224x224 inputs; smaller ones down to 32x32 work (adaptive pooling)."""
    return _imagenet_resnet(_bottleneck, (3, 4, 6, 3), num_classes)


class _SinusoidalPosition(nn.Module):
    """Adds the sine/cosine position code of Vaswani et al. 2017 to ``(B, T, d_model)`` inputs, then dropout."""

    def __init__(self, d_model, max_len, dropout):
        super().__init__()
        position = torch.arange(max_len, dtype=torch.float32)[:, None]
        frequency = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
        code = torch.zeros(max_len, d_model)
        code[:, 0::2] = torch.sin(position * frequency)
        code[:, 1::2] = torch.cos(position * frequency)
        self.register_buffer("code", code, persistent=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        if x.shape[1] > len(self.code):
            raise ValueError(f"sequence length {x.shape[1]} exceeds the model's max_len {len(self.code)}")
        return self.dropout(x + self.code[: x.shape[1]])


class Seq2SeqTransformer(nn.Module):
    """An encoder-decoder Transformer (``torch.nn.Transformer``, post-norm, batch first) over one shared vocabulary.

    One token embedding, scaled by ``sqrt(d_model)``, serves source and
    target and is also the output projection (tied weights, as in Vaswani
    et al. 2017, section 3.4; the projection has its own bias).  Token id
    ``PAD`` (0) is padding: it is masked from attention as a key, and the
    decoder is causal.

    Args:
        vocab_size: tokens in the shared vocabulary, PAD included.
        d_model: width of embeddings and layers (default 64; even).
        nhead: attention heads (default 4; divides ``d_model``).
        num_encoder_layers: default 2.
        num_decoder_layers: default 2.
        dim_feedforward: hidden width of the feed-forward layers (default 128).
        dropout: after the position code and inside every layer (default 0.1).
        max_len: the longest source or target sequence accepted (default 256).

    Example::

        logits = model(src, tgt[:, :-1])      # (B, T, vocab_size)
        loss = F.cross_entropy(logits.transpose(1, 2), tgt[:, 1:], ignore_index=PAD)
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 64,
        nhead: int = 4,
        num_encoder_layers: int = 2,
        num_decoder_layers: int = 2,
        dim_feedforward: int = 128,
        dropout: float = 0.1,
        max_len: int = 256,
    ) -> None:
        super().__init__()
        if d_model % 2 or d_model % nhead:
            raise ValueError(f"d_model must be even and divisible by nhead {nhead}, got {d_model}")
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=PAD)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)  # scaled by sqrt(d_model): unit variance
        with torch.no_grad():
            self.embedding.weight[PAD].zero_()
        self.position = _SinusoidalPosition(d_model, max_len, dropout)
        # nn.Transformer's own encoder, less its nested-tensor fast path (a prototype that warns).
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, batch_first=True)
        encoder = nn.TransformerEncoder(layer, num_encoder_layers, nn.LayerNorm(d_model), enable_nested_tensor=False)
        self.transformer = nn.Transformer(
            d_model,
            nhead,
            num_encoder_layers,
            num_decoder_layers,
            dim_feedforward,
            dropout,
            custom_encoder=encoder,
            batch_first=True,
        )
        self.output = nn.Linear(d_model, vocab_size)
        self.output.weight = self.embedding.weight

    def _embed(self, tokens):
        return self.position(self.embedding(tokens) * math.sqrt(self.d_model))

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, T, vocab_size)`` for each decoder position from
        ``src (B, S)`` and the decoder input ``tgt_in (B, T)`` (token ids)."""
        length = tgt_in.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=tgt_in.device).triu(1)
        src_padding = src == PAD
        hidden = self.transformer(
            self._embed(src),
            self._embed(tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=src_padding,
            tgt_key_padding_mask=tgt_in == PAD,
            memory_key_padding_mask=src_padding,
            tgt_is_causal=True,
        )
        return self.output(hidden)


def transformer_base(vocab_size: int, dropout: float = 0.1, max_len: int = 256) -> Seq2SeqTransformer:
    """The "base" Transformer of Vaswani et al. 2017, the paper's standard-sized
    model: d_model 512, 8 heads, 6 + 6 layers, feed-forward 2048."""
    return Seq2SeqTransformer(
        vocab_size,
        d_model=512,
        nhead=8,
        num_encoder_layers=6,
        num_decoder_layers=6,
        dim_feedforward=2048,
        dropout=dropout,
        max_len=max_len,
    )


def _is_classification(spec):
    return spec.task == "classification"


def _is_image(spec):
    return spec.task == "classification" and len(spec.input_shape) == 3 and spec.input_shape[0] == 3


def _is_seq2seq(spec):
    return spec.task == "seq2seq"


#: Constructor arguments the dataset fixes (see ``_from_spec``); no override may set them.
_SPEC_ARGUMENTS = ("in_features", "num_classes", "vocab_size")


def _from_spec(spec, factory):
    """The arguments of ``factory`` that the dataset ``spec`` fixes."""
    values = {
        "in_features": math.prod(spec.input_shape),
        "num_classes": spec.num_classes,
        "vocab_size": spec.vocab_size,
    }
    return {name: values[name] for name in inspect.signature(factory).parameters if name in _SPEC_ARGUMENTS}


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """How the registry builds one model for a dataset.

    Args:
        name: the registry name.
        factory: builds the model; its arguments named in ``_SPEC_ARGUMENTS``
            (input width, classes, vocabulary) come from the dataset's spec.
        accepts: whether a dataset's ``DataSpec`` suits the model.
        needs: what ``accepts`` asks for, in words (for error messages).
    """

    name: str
    factory: Callable[..., nn.Module]
    accepts: Callable[..., bool]
    needs: str

    def options(self) -> list[str]:
        """The factory's arguments that a caller may override (those the spec does not fix)."""
        return [name for name in inspect.signature(self.factory).parameters if name not in _SPEC_ARGUMENTS]

    def __call__(self, spec: DataSpec, **overrides: Any) -> nn.Module:
        """The model for ``spec``, with ``overrides`` passed to the factory.

        Raises:
            ValueError: the spec does not suit the model, or an override is not one of ``options()``.
        """
        if not self.accepts(spec):
            raise ValueError(
                f"model {self.name!r} needs {self.needs}; dataset {spec.name!r} gives "
                f"{spec.task} samples of shape {tuple(spec.input_shape)}; "
                f"accepted models for it: {', '.join(compatible_models(spec)) or 'none'}"
            )
        unknown = sorted(set(overrides) - set(self.options()))
        if unknown:
            raise ValueError(
                f"unknown option {', '.join(map(repr, unknown))} for model {self.name!r}; "
                f"accepted: {', '.join(self.options()) or 'none'}"
            )
        return self.factory(**_from_spec(spec, self.factory), **overrides)


#: The models' names, as the CLI takes them (the keys of :data:`MODELS`).
ModelName = Literal["mlp", "resnet20", "resnet18", "resnet50", "transformer", "transformer-base"]
#: The values of :data:`ModelName`, in its order.
MODEL_NAMES: tuple[ModelName, ...] = get_args(ModelName)

#: Models by the name the CLI uses.
MODELS = {
    entry.name: entry
    for entry in (
        ModelEntry("mlp", MLP, _is_classification, "a classification dataset"),
        ModelEntry("resnet20", resnet20, _is_image, "image inputs (3, H, W)"),
        ModelEntry("resnet18", resnet18, _is_image, "image inputs (3, H, W)"),
        ModelEntry("resnet50", resnet50, _is_image, "image inputs (3, H, W)"),
        ModelEntry("transformer", Seq2SeqTransformer, _is_seq2seq, "a seq2seq dataset"),
        ModelEntry("transformer-base", transformer_base, _is_seq2seq, "a seq2seq dataset"),
    )
}


def compatible_models(spec: DataSpec) -> list[str]:
    """The names of the models that accept the dataset described by ``spec``, in registry order."""
    return [name for name, entry in MODELS.items() if entry.accepts(spec)]


def build_model(name: ModelName, spec: DataSpec, **overrides: Any) -> nn.Module:
    """Build model ``name`` sized for the dataset ``spec`` (a :class:`wagma.datasets.DataSpec`).

    The MLP takes its input width (the flattened sample) and classes from the
    spec, the ResNets their classes, the Transformers their vocabulary;
    ``overrides`` set the model's other constructor arguments.

    Raises:
        ValueError: ``name`` is unknown, the spec does not suit the model, or
            an override is not accepted; the message lists the accepted values.
    """
    if name not in MODELS:
        raise ValueError(f"model must be one of {', '.join(map(repr, MODELS))}, got {name!r}")
    return MODELS[name](spec, **overrides)
