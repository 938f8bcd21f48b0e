"""libckpt.torch in a multi-process job on gloo: 2 and 4 processes launched as
torchrun launches them, saving and loading with another world size."""
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

from launch import launch  # noqa: E402


@pytest.mark.parametrize("save_world,load_worlds", [(2, (4, 1)), (4, (2,))])
def test_save_and_load_with_another_world(tmp_path, save_world, load_worlds):
    root, ref = tmp_path / "root", tmp_path / "ref.pt"
    launch(save_world, "dist_worker.py", "save", root, 7, ref)
    for w in load_worlds:
        launch(w, "dist_worker.py", "load", root, 7, ref)
    launch(load_worlds[0], "dist_worker.py", "rankbound", root, 7)


def test_a_failed_save_is_invisible_on_every_rank(tmp_path):
    launch(2, "dist_worker.py", "fail", tmp_path / "root", 3)
