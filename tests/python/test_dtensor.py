"""libckpt.torch with DTensor and FSDP2 state on gloo (CPU), saved with one world size
and loaded with another and other placements. Needs torch >= 2.4."""
import pytest

torch = pytest.importorskip("torch")
_v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
if _v < (2, 4):
    pytest.skip(f"DTensor and FSDP2 need torch >= 2.4, this is {torch.__version__}",
                allow_module_level=True)

from launch import launch  # noqa: E402


@pytest.mark.parametrize("save_world,load_world", [(2, 4), (4, 2), (4, 3)])
def test_dtensor_and_fsdp2_reshard(tmp_path, save_world, load_world):
    root, ref = tmp_path / "root", tmp_path / "ref.pt"
    launch(save_world, "dtensor_worker.py", "save", root, ref)
    launch(load_world, "dtensor_worker.py", "load", root, ref)
