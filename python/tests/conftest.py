import pytest

import gpucloud as gc


def _devices():
    cases = [pytest.param(gc.Device.host(), id="host")]
    if gc.cuda_device_count() > 0:
        cases.append(pytest.param(gc.Device.cuda(0), id="cuda0"))
    else:
        cases.append(
            pytest.param(None, id="cuda0", marks=pytest.mark.skip(reason=f"no CUDA device: {gc.cuda_unavailable_reason()}"))
        )
    return cases


@pytest.fixture(params=_devices())
def device(request):
    """Every available device: the host always, cuda:0 where there is a GPU (skipped with the reason elsewhere)."""
    return request.param


@pytest.fixture
def stream(device):
    s = gc.Stream(device)
    yield s
    s.synchronize()


@pytest.fixture
def host_stream():
    """A host stream, for tests that hand NumPy (pageable host) arrays to kernels."""
    s = gc.Stream()
    yield s
    s.synchronize()
