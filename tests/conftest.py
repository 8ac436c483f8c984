import pytest
import torch

# Tiny models: one intra-op thread is many times faster than two on a 2-core machine, and oneDNN
# spends seconds building a primitive for every new conv shape.
torch.set_num_threads(1)
torch.backends.mkldnn.enabled = False


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def tiny_voice(tmp_path_factory):
    """(acoustic dir, vocoder dir) of a tiny FastPitch + HiFi-GAN converted from DLE checkpoints."""
    from tiny import make_voice

    return make_voice(tmp_path_factory.mktemp("voice"))
