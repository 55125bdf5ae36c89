"""A broken checkpoint directory fails with a message that names the problem."""

import json
import shutil

import pytest

from heisd_ros.models.openvla.config import OpenVLAOptions
from heisd_ros.models.openvla.loader import load_openvla, load_target
from test.openvla_fixtures import TINY_VISION, write_tiny_openvla

OPTIONS = OpenVLAOptions(vision=TINY_VISION, unnorm_key="bridge_orig")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return write_tiny_openvla(tmp_path_factory.mktemp("pristine"))


@pytest.fixture()
def ckpt(pristine, tmp_path):
    return shutil.copytree(pristine, tmp_path / "ckpt")


def _edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _rename_tensor(directory, old: str, new: str) -> None:
    from safetensors.torch import load_file, save_file

    index_path = directory / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = directory / index["weight_map"].pop(old)
    tensors = load_file(str(shard))
    tensors[new] = tensors.pop(old)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index["weight_map"][new] = shard.name
    index_path.write_text(json.dumps(index))


def test_the_pristine_fixture_loads(ckpt):
    assert load_openvla(ckpt, OPTIONS).unnorm_key == "bridge_orig"


def test_single_file_layout_loads_too(ckpt):
    from safetensors.torch import load_file, save_file

    tensors = {}
    for shard in sorted(ckpt.glob("model-*.safetensors")):
        tensors.update(load_file(str(shard)))
        shard.unlink()
    (ckpt / "model.safetensors.index.json").unlink()
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    assert load_openvla(ckpt, OPTIONS).hidden_size == 64


def test_missing_shard(ckpt):
    (ckpt / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing shard.*model-00002-of-00003"):
        load_openvla(ckpt, OPTIONS)


def test_no_weights_at_all(ckpt):
    for shard in ckpt.glob("model*"):
        shard.unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors.index.json"):
        load_openvla(ckpt, OPTIONS)


def test_corrupt_shard(ckpt):
    (ckpt / "model-00001-of-00003.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=r"model-00001-of-00003.*not a readable safetensors"):
        load_openvla(ckpt, OPTIONS)


def test_wrong_key_name(ckpt):
    # timm's own name for the LayerScale weight; Prismatic checkpoints say scale_factor.
    _rename_tensor(ckpt, "vision_backbone.featurizer.blocks.0.ls1.scale_factor",
                   "vision_backbone.featurizer.blocks.0.ls1.gamma")
    with pytest.raises(ValueError, match=r"missing \[.*blocks\.0\.ls1\.scale_factor.*unexpected "
                                         r"\[.*blocks\.0\.ls1\.gamma"):
        load_openvla(ckpt, OPTIONS)


def test_index_names_a_tensor_its_shard_lacks(ckpt):
    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["projector.fc4.weight"] = "model-00001-of-00003.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"not in their shard.*projector\.fc4\.weight"):
        load_openvla(ckpt, OPTIONS)


def test_tensors_smaller_than_the_configured_vocabulary(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    config["text_config"]["vocab_size"] = 32128        # tokenizer still fits: 32128 - 128
    config["pad_to_multiple_of"] = 128
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"vocabulary size mismatch.*embed_tokens.*\(32064, 64\)"):
        load_openvla(ckpt, OPTIONS)


def test_tokenizer_does_not_fit_the_configured_vocabulary(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    config["text_config"]["vocab_size"] = 32000         # 32000 - 64 action base != 32000 tokens
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"vocabulary size mismatch.*32000 tokens.*31936"):
        load_openvla(ckpt, OPTIONS)


def test_no_dataset_statistics(ckpt):
    (ckpt / "dataset_statistics.json").unlink()
    with pytest.raises(FileNotFoundError, match="dataset_statistics.json"):
        load_openvla(ckpt, OPTIONS)


def test_unknown_unnorm_key_lists_the_available_ones(ckpt):
    options = OpenVLAOptions(vision=TINY_VISION, unnorm_key="libero_goal")
    with pytest.raises(ValueError, match=r"'libero_goal'.*bridge_orig.*libero_spatial_no_noops"):
        load_openvla(ckpt, options)


def test_several_datasets_need_an_unnorm_key(ckpt):
    with pytest.raises(ValueError, match=r"choose one with unnorm_key.*bridge_orig"):
        load_openvla(ckpt, OpenVLAOptions(vision=TINY_VISION))


def test_real_backbone_sizes_with_tiny_tensors(ckpt):
    with pytest.raises(ValueError, match=r"missing \[.*vision_backbone\.featurizer\.blocks"):
        load_openvla(ckpt, OpenVLAOptions(unnorm_key="bridge_orig"))


def test_wrong_tensor_shape(ckpt):
    from safetensors.torch import load_file, save_file

    shard = ckpt / "model-00001-of-00003.safetensors"
    tensors = load_file(str(shard))
    name = next(n for n in tensors if n.endswith("mlp.fc1.weight"))
    tensors[name] = tensors[name][:-1].contiguous()
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"wrong shape.*{name}"):
        load_openvla(ckpt, OPTIONS)


def test_unknown_backbone(ckpt):
    _edit_json(ckpt / "config.json", timm_model_ids=["vit_base_patch16_224", "x"])
    with pytest.raises(ValueError, match=r"timm_model_ids.*vit_large_patch14_reg4_dinov2"):
        load_openvla(ckpt, OpenVLAOptions(unnorm_key="bridge_orig"))


def test_preprocessing_that_differs_from_ours(ckpt):
    _edit_json(ckpt / "preprocessor_config.json", image_resize_strategy="letterbox")
    with pytest.raises(ValueError, match=r"image_resize_strategy is letterbox"):
        load_openvla(ckpt, OPTIONS)


def test_not_a_directory_and_unknown_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_openvla(tmp_path / "nowhere", OPTIONS)
    with pytest.raises(ValueError, match=r"model: expected one of \('openvla',\)"):
        load_target("openvla-oft", tmp_path)


@pytest.mark.parametrize("field,value", [("crop_area_fraction", 0.0), ("dtype", "int8"),
                                         ("attn_implementation", "flash_attention_2"),
                                         ("unnorm_key", "")])
def test_options_name_the_bad_field(field, value):
    with pytest.raises(ValueError, match=field):
        OpenVLAOptions(**{field: value})
