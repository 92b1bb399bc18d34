"""Cutting the full seeded model down to what one rank's pipeline stage holds.

Every rank builds the whole model (layout-independent initialisation) and tensor-parallelises the
module it runs; these functions then remove everything else, from outside: the model code stays
single-device. Layers sit in ModuleDicts keyed by their global index, so a stage keeps the names a
single-process model has and checkpoints, gathers and optimizers need no renaming.

A module the rank does not run keeps its Python objects (configs, sizes such as `tokens_per_image`
stay readable) but loses all its parameters, so no optimizer, norm or reduction sees it. The Out path
(output projections and decoders) runs where the LM's final states are: on the LM's last stage, not on
its modality's ranks.
"""

from __future__ import annotations

from torch import nn

from mimo.models.llm import DecoderLM
from mimo.models.multimodal import ModalitySubmodules
from mimo.models.vit import VisionTransformer
from mimo.parallel.data import REPLICAS


def stage_layers(n_layers: int, pp: int, pp_rank: int) -> list[str]:
    """Keys of the layers stage `pp_rank` of `pp` holds: contiguous, sizes differing by at most one,
    earlier stages taking the smaller share (the last stage also runs the norm and the head)."""
    if n_layers < pp:
        raise ValueError(f"{n_layers} layers cannot fill {pp} pipeline stages; use pp <= {n_layers}")
    return [str(i) for i in range(pp_rank * n_layers // pp, (pp_rank + 1) * n_layers // pp)]


def chunk_layers(n_layers: int, pp: int, pp_rank: int, chunks: int) -> list[list[str]]:
    """Keys of the layers of each model chunk stage `pp_rank` holds under the interleaved schedule: the model
    cut into pp x chunks contiguous virtual stages (`stage_layers`), chunk k of this rank being virtual stage
    k x pp + pp_rank, so a rank's chunks are not contiguous. One chunk is `stage_layers`."""
    if n_layers < pp * chunks:
        raise ValueError(f"{n_layers} layers cannot fill {pp} pipeline stages x {chunks} virtual stages; use "
                         f"pp x virtual_stages <= {n_layers}")
    return [stage_layers(n_layers, pp * chunks, k * pp + pp_rank) for k in range(chunks)]


def _keep_layers(layers: nn.ModuleDict, keep: list[str]) -> None:
    for key in list(layers):
        if key not in keep:
            del layers[key]


def split_lm(lm: DecoderLM, pp_rank: int, pp: int, chunks: int = 1) -> None:
    """Stage `pp_rank` of the LM: its layers (those of its `chunks` model chunks, `chunk_layers`); the
    embedding on the first stage; norm and head on the last.

    Tied embeddings: the last stage keeps its own copy of the embedding as the head's weight. Both
    copies start equal and get the same (summed, see `PipelinePlan.sync_tied_embeddings`) gradient,
    so they stay equal; each counts as one of two replicas in the global gradient norm.
    """
    _keep_layers(lm.layers, [key for keys in chunk_layers(len(lm.layers), pp, pp_rank, chunks) for key in keys])
    first, last = pp_rank == 0, pp_rank == pp - 1
    tied = lm.cfg.tie_embeddings
    if not first and not (last and tied):
        lm.embed_tokens = None
    if not last:
        lm.norm = None
        lm.lm_head = None
    if tied and pp > 1 and lm.embed_tokens is not None:
        w = lm.embed_tokens.weight
        setattr(w, REPLICAS, getattr(w, REPLICAS, 1) * 2)


def only_encoder(sub: ModalitySubmodules, name: str) -> tuple[str, nn.Module]:
    """The modality's one encoder: the pipeline bridge orders rows by sample, which several encoders'
    concatenated outputs are not."""
    if len(sub.encoders) != 1:
        raise ValueError(f"modality '{name}' has {len(sub.encoders)} encoders ({list(sub.encoders)}); layouts "
                         "with modules on disjoint ranks support one encoder per modality")
    return next(iter(sub.encoders.items()))


def split_encoder(sub: ModalitySubmodules, name: str, pp_rank: int, pp: int) -> None:
    """Stage `pp_rank` of a modality: its ViT layers; patch and position embeddings on the first stage;
    the final norm and the input projections on the last."""
    _, encoder = only_encoder(sub, name)
    if pp == 1:
        return
    if not isinstance(encoder, VisionTransformer):
        raise ValueError(f"modality '{name}': pipeline parallelism splits VisionTransformer encoders only, got "
                         f"{type(encoder).__name__}; set parallel.modules.{name}.pp = 1")
    _keep_layers(encoder.layers, stage_layers(len(encoder.layers), pp, pp_rank))
    if pp_rank > 0:
        encoder.patch_embedding = None
        encoder.class_embedding = None
        encoder.position_embedding = None
        encoder.pre_layrnorm = None
    if pp_rank < pp - 1:
        encoder.post_layernorm = None
        sub.input_projections = nn.ModuleList()


def out_path_parts(sub: ModalitySubmodules) -> list[nn.Module]:
    """A modality's Out path: its output projections and decoders."""
    return [sub.output_projections, sub.decoders]


def keep_out_path(sub: ModalitySubmodules, replicas: int) -> None:
    """What the LM's last stage holds of a modality with an Out path: its output projections and decoders,
    whole, `replicas` identical copies per data lane (the stage's TP x CP ranks each decode the whole
    sequence); its encoders and input projections run on the modality's own ranks."""
    drop_parameters(sub.encoders)
    drop_parameters(sub.input_projections)
    for part in out_path_parts(sub):
        for p in part.parameters():
            setattr(p, REPLICAS, getattr(p, REPLICAS, 1) * replicas)


def drop_parameters(module: nn.Module) -> None:
    """Remove every parameter of `module` (it runs on other ranks), keeping the module objects."""
    for m in module.modules():
        for key, _ in list(m.named_parameters(recurse=False)):
            m.register_parameter(key, None)
