"""Loading layouts: with/without index, sharded, dtypes, tied heads, transformers' own files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from mkcode.backend.checkpoint import CheckpointError, load_checkpoint, load_state_dict
from tests.backend.checkpoint.helpers import read_all, write_variant
from tests.backend.checkpoint.tiny import tiny_checkpoint

LM_HEAD = "lm_head.weight"
EMBED = "model.embed_tokens.weight"


def _same(a, b) -> bool:
    sa, sb = a.weights.state_dict(a.config), b.weights.state_dict(b.config)
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_without_index_scans_all_shards(tiny_dir: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(tiny_dir, tmp_path / "noindex"))
    (copy / "model.safetensors.index.json").unlink()
    a, b = load_checkpoint(tiny_dir, progress=False), load_checkpoint(copy, progress=False)
    assert a.used_index and not b.used_index
    assert len(b.files) >= 2 and _same(a, b)


def test_single_file_per_expert_without_index(
    tiny_dir: Path, tiny_per_expert_dir: Path, tmp_path: Path
) -> None:
    one = write_variant(tiny_dir, tmp_path / "one", {"model.safetensors": read_all(tiny_per_expert_dir)})
    assert _same(load_checkpoint(one, progress=False), load_checkpoint(tiny_dir, progress=False))


def test_index_is_used_to_choose_files(tiny_dir: Path, tmp_path: Path) -> None:
    """A stray safetensors file the index does not name is not read."""
    copy = Path(shutil.copytree(tiny_dir, tmp_path / "stray"))
    write_variant(tiny_dir, tmp_path / "x", {"extra.safetensors": {"junk": torch.zeros(2)}})
    shutil.copy(tmp_path / "x" / "extra.safetensors", copy / "extra.safetensors")
    assert _same(load_checkpoint(copy, progress=False), load_checkpoint(tiny_dir, progress=False))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dtype_conversion(tiny_dir: Path, dtype: torch.dtype) -> None:
    loaded = load_checkpoint(tiny_dir, dtype=dtype, progress=False)
    ref = read_all(tiny_dir)
    sd = loaded.weights.state_dict(loaded.config)
    assert all(t.dtype == dtype for t in sd.values())
    assert torch.equal(sd[EMBED], ref[EMBED].to(dtype))


def test_checkpoint_dtype_is_the_default(ckpt_root: Path) -> None:
    bf16 = tiny_checkpoint(ckpt_root, torch_dtype="bfloat16")
    assert load_checkpoint(bf16, progress=False).weights.dtype == torch.bfloat16


def test_chunked_copy_of_large_tensors(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensors bigger than a chunk are copied in several row blocks (tiny chunk forces it)."""
    from mkcode.backend.checkpoint import transfer

    monkeypatch.setattr(transfer, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(transfer.ChunkCopier.__init__, "__defaults__", (4096,))
    assert _same(load_checkpoint(tiny_dir, progress=False), load_checkpoint(tiny_dir, progress=False))
    ref = read_all(tiny_dir)
    sd = load_state_dict(tiny_dir, progress=False)
    assert all(torch.equal(sd[k], ref[k]) for k in ref)


def test_tied_lm_head_identical_is_accepted(tiny_dir: Path, tmp_path: Path) -> None:
    stored = read_all(tiny_dir)
    stored[LM_HEAD] = stored[EMBED].clone()
    d = write_variant(tiny_dir, tmp_path / "tied", {"model.safetensors": stored})
    loaded = load_checkpoint(d, progress=False)
    assert loaded.weights.lm_head is loaded.weights.embed
    assert torch.equal(loaded.weights.embed, stored[EMBED])


def test_tied_lm_head_different_is_refused(tiny_dir: Path, tmp_path: Path) -> None:
    stored = read_all(tiny_dir)
    stored[LM_HEAD] = stored[EMBED] + 1
    d = write_variant(
        tiny_dir,
        tmp_path / "tied",
        {"a.safetensors": {LM_HEAD: stored.pop(LM_HEAD)}, "b.safetensors": stored},
    )
    with pytest.raises(CheckpointError, match=r"lm_head\.weight.*a\.safetensors.*tie_word_embeddings"):
        load_checkpoint(d, progress=False)


def test_ignores_rotary_inv_freq_buffers(tiny_dir: Path, tmp_path: Path) -> None:
    stored = read_all(tiny_dir)
    stored["model.layers.1.self_attn.rotary_emb.inv_freq"] = torch.ones(16)
    d = write_variant(tiny_dir, tmp_path / "inv", {"model.safetensors": stored})
    assert _same(load_checkpoint(d, progress=False), load_checkpoint(tiny_dir, progress=False))


def test_loaded_checkpoint_metadata(tiny_dir: Path) -> None:
    loaded = load_checkpoint(tiny_dir, progress=False)
    assert loaded.tokenizer_file == tiny_dir / "tokenizer.json"
    assert loaded.generation_config["eos_token_id"] == loaded.config.eos_token_ids[0]
    assert loaded.nbytes == sum(t.nbytes for t in read_all(tiny_dir).values())
    assert loaded.seconds > 0 and loaded.gb_per_s > 0


def test_progress_bar_off_when_not_a_tty(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    load_checkpoint(tiny_dir, progress=True)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
