"""White balance on the commonest catalog shot: white and pale products on white, cream, beige
and grey paper (the quality set's ``pale`` class, true masks), and coloured subjects that must
not be taken for a white reference."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_kernels.backends import RetouchOptions
from gpu_kernels.quality import neutral_cast
from gpu_kernels.retouch import CpuRetoucher
from lightbox.datasets.quality_set import TruthItem, quality_set

KEEP = RetouchOptions("keep")
PALE = quality_set(classes=("pale",))


@pytest.mark.parametrize("item", PALE, ids=[it.name for it in PALE])
def test_a_pale_product_on_light_paper_keeps_its_colour(item: TruthItem) -> None:
    """Median a*, b* of the product's inner pixels after pass (a) within 4 of the input's
    (before: a cream product on cream paper went from b* +9 to -2, a white one in the shade of a
    cream sweep to b* -12)."""
    mask = np.rint(item.alpha * 255).astype(np.uint8)
    out = CpuRetoucher().correct([item.image], [mask], KEEP)[0]
    a0, b0 = neutral_cast(item.image, item.product)
    a1, b1 = neutral_cast(out, item.product)
    assert abs(a1 - a0) <= 4 and abs(b1 - b0) <= 4, (item.name, (a0, b0), (a1, b1))


def test_a_coloured_subject_is_no_white_reference() -> None:
    """An orange cat on sage or blue paper: the gains stay within 3 % of 1 (taking the cat's fur
    for a warm white would turn it grey-blue)."""
    r = CpuRetoucher()
    for item in quality_set(classes=("fur",)):
        if item.name.endswith(("sage", "blue")):
            mask = np.rint(item.alpha * 255).astype(np.uint8)
            wb = np.asarray(r.plan(item.image, mask, KEEP).wb)
            assert np.all(np.abs(np.log(wb)) <= np.log(1.03)), (item.name, wb)
