import pytest
import torch


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def tiny_voice(tmp_path_factory):
    """(acoustic dir, vocoder dir) of a tiny FastPitch + HiFi-GAN converted from DLE checkpoints."""
    from tiny import make_voice

    return make_voice(tmp_path_factory.mktemp("voice"))
