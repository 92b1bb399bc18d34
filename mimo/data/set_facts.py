"""What each data set (data.name) asks of a run, as pure facts the gate and the planner read through the
data-set registry (mimo.tasks.DATA_SETS): the length of the rows the LM sees (`*_row_length`), the model's
modalities and rows it must fit (`check_*`), the tokenizer its text is written with (`*_tokenizer`), and what a
sample holds on average (`*_inputs_per_sample`, `*_clip_samples`). Pure, not collective; a check raises a
ConfigError that names the field and the fix."""

from __future__ import annotations

from mimo.config.schema import Config, ConfigError, ModalityConfig, ModelConfig
from mimo.data.audio_demo import CLIP_SAMPLES, LAYOUTS, avlm_row_length
from mimo.data.demo import demo_row_length
from mimo.data.media import clip_samples
from mimo.data.shapes import IMAGE_SIZE
from mimo.data.text_to_image import text_to_image_row_length
from mimo.models.anyres import anyres_rows
from mimo.models.audio import AudioEncoder
from mimo.models.audio_features import WHISPER_HOP

REAL_KINDS = [["vision"], ["audio"], ["audio", "vision"], ["native_vision"]]
"""The sorted modality kinds real data (jsonl, webdataset) feeds: one vision, one audio, one of each, one
native_vision modality."""


# Row lengths: tokens of every row the LM sees (None when the model lacks what the set needs; `mimo plan`
# may plan a model for other data) ---------------------------------------------------------------------

def image_rows(m: ModalityConfig) -> int:
    """Rows a demo image (shapes' IMAGE_SIZE square) gives a vision modality: its ViT's tokens, or an anyres
    modality's tiles, newline rows included (mimo.models.anyres.anyres_rows)."""
    if not m.anyres_grid_pinpoints:
        return m.vit.tokens_per_image
    return anyres_rows((IMAGE_SIZE, IMAGE_SIZE), m.vit.image, m.vit.patch, m.anyres_grid_pinpoints,
                       m.anyres_max_tiles, m.vit.tokens_per_image)


def first_vision_rows(model: ModelConfig) -> int | None:
    """Rows a demo image gives the model's first vision modality; None without one."""
    vision = [image_rows(m) for m in model.modalities.values() if m.kind == "vision"]
    return vision[0] if vision else None


def shapes_row_length(cfg: Config, model: ModelConfig) -> int | None:
    rows = first_vision_rows(model)
    return None if rows is None else demo_row_length(rows * cfg.data.images_per_sample)


def avlm_rows(cfg: Config, model: ModelConfig) -> int | None:
    rows = first_vision_rows(model)
    return None if rows is None else avlm_row_length(rows)


def text_to_image_rows(cfg: Config, model: ModelConfig) -> int | None:
    outs = [(m.decoder.image // m.decoder.patch) ** 2 for m in model.modalities.values() if m.output_token_id >= 0]
    return text_to_image_row_length(outs[0]) if outs else None


def seq_len_rows(cfg: Config, model: ModelConfig) -> int:
    """Synthetic and real data pad (or fill) every row to data.seq_len."""
    return cfg.data.seq_len


# Tokenizers: the spec the set's text is written with ("byte", a folder), None for synthetic ids -----------

def byte_tokenizer(cfg: Config) -> str:
    return "byte"


def no_tokenizer(cfg: Config) -> None:
    return None


def config_tokenizer(cfg: Config) -> str:
    return cfg.data.tokenizer


# What a sample holds: average inputs of a modality kind per sample, audio samples of one clip (the encoder
# takes `max_positions`) ----------------------------------------------------------------------------------

def mean_inputs_per_sample(cfg: Config, kind: str) -> float:
    """One clip per sample; data.images_per_sample (its range's middle) images."""
    if kind == "audio":
        return 1.0
    low, high = cfg.data.images_range
    return (low + high) / 2


def avlm_inputs_per_sample(cfg: Config, kind: str) -> float:
    """The share of the AVLM demo's sample layouts that hold an image (vision) or a clip (audio)."""
    word = "image" if kind == "vision" else "audio"
    return sum(word in present for present, _ in LAYOUTS) / len(LAYOUTS)


def avlm_clip_samples(cfg: Config, max_positions: int) -> int:
    return CLIP_SAMPLES


# Checks of the model against the set -------------------------------------------------------------------

def check_kinds(cfg: Config, model: ModelConfig, accepted: list[list[str]], what: str) -> None:
    """The model's sorted modality kinds are one of `accepted` (`what` says them in words)."""
    kinds = sorted(m.kind for m in model.modalities.values())
    if kinds not in accepted:
        raise ConfigError(f"data.name = '{cfg.data.name}' needs {what} under model.modalities; this model has "
                          f"{dict(zip(model.modalities, kinds)) or 'none'}")


def refuse_anyres(cfg: Config, model: ModelConfig) -> None:
    """A set that does not tile images trains no anyres modality."""
    tiled = [n for n, m in model.modalities.items() if m.anyres_grid_pinpoints]
    if tiled:
        raise ConfigError(f"model.modalities.{tiled[0]}.anyres_grid_pinpoints is set, but data.name = "
                          f"'{cfg.data.name}' does not tile images (the shapes demo, jsonl and webdataset do); train "
                          "it on one of those, or with anyres_grid_pinpoints = [] (one tile per image)")


def check_shapes(cfg: Config, model: ModelConfig) -> None:
    check_kinds(cfg, model, [["vision"]], "one vision modality")


def check_avlm(cfg: Config, model: ModelConfig) -> None:
    check_kinds(cfg, model, [["audio", "vision"]], "one vision and one audio modality")
    refuse_anyres(cfg, model)


def check_text_to_image(cfg: Config, model: ModelConfig) -> None:
    """Any modalities, exactly one of them with an Out path that draws RGB."""
    refuse_anyres(cfg, model)
    outs = [m for m in model.modalities.values() if m.output_token_id >= 0]
    if len(outs) != 1 or outs[0].decoder.channels != 3:
        raise ConfigError("data.name = 'text_to_image' needs exactly one modality with an Out path that draws RGB: "
                          "set model.modalities.<name>.output_token_id (e.g. 261) and decoder.channels = 3")


def check_synthetic(cfg: Config, model: ModelConfig) -> None:
    """One vision modality; a row holds a sample's image placeholders and some text."""
    check_kinds(cfg, model, [["vision"]], "exactly one vision modality")
    refuse_anyres(cfg, model)
    tokens = next(m.vit.tokens_per_image for m in model.modalities.values())
    placeholders = tokens * cfg.data.images_per_sample
    if cfg.data.seq_len <= placeholders:
        raise ConfigError(f"data.seq_len ({cfg.data.seq_len}) must exceed the {placeholders} image placeholders "
                          f"of a sample (data.images_per_sample x the image's {tokens} tokens) plus its text; "
                          "raise data.seq_len")


def check_real_data(cfg: Config, model: ModelConfig) -> None:
    """jsonl and webdataset: the modalities real data feeds (an anyres one only as the model's only modality),
    and rows that hold a sample's placeholders."""
    check_kinds(cfg, model, REAL_KINDS,
                "one vision modality, one audio modality, one of each, or one native_vision modality")
    tiled = [n for n, m in model.modalities.items() if m.anyres_grid_pinpoints]
    if tiled and len(model.modalities) != 1:
        raise ConfigError(f"model.modalities.{tiled[0]}.anyres_grid_pinpoints is set with data.name = "
                          f"'{cfg.data.name}', which tiles the images of an anyres modality that is the model's only "
                          f"one; this model has {sorted(model.modalities)} under model.modalities")
    check_real_data_rows(cfg, model)


def check_real_data_rows(cfg: Config, model: ModelConfig) -> None:
    """A row of real data holds every input's placeholders (an image's patches, a padded clip's frames) and
    text; a clip of data.audio_seconds fits the audio encoder."""
    placeholders = 0
    for name, m in model.modalities.items():
        if m.kind == "vision":
            placeholders += m.vit.tokens_per_image
            continue
        if m.kind == "native_vision":  # the fewest an image gives; a sample whose image gives more may be skipped
            placeholders += m.native.min_pixels // (m.native.patch * m.native.merge) ** 2 + 2 * m.native.marked
            continue
        samples = clip_samples(cfg, m.audio.max_positions)
        if samples // WHISPER_HOP > 2 * m.audio.max_positions:
            raise ConfigError(f"data.audio_seconds = {cfg.data.audio_seconds} gives clips of {samples // WHISPER_HOP} "
                              f"frames, more than the {2 * m.audio.max_positions} that model.modalities.{name}.audio"
                              f".max_positions covers; lower data.audio_seconds or raise max_positions")
        placeholders += AudioEncoder.output_frames(samples // WHISPER_HOP)
    if cfg.data.seq_len < placeholders + 3:
        raise ConfigError(f"data.seq_len ({cfg.data.seq_len}) must exceed the {placeholders} placeholders of a "
                          "sample's inputs (an image's patches, a clip's frames) plus its text; raise data.seq_len"
                          + (" or lower data.audio_seconds" if any(m.kind == "audio" for m in model.modalities.values())
                             else ""))
