"""Choosing the splits evaluated (`lra_jax.training.evaluation`): the validation subset, empty splits."""

import numpy as np
import pytest
from helpers import tiny_config

from lra_jax.config.settings import from_config
from lra_jax.errors import DataError
from lra_jax.training import evaluation


def test_validation_subset_is_fixed_by_seed_keeps_order_and_pairs():
    tokens, labels = np.arange(100)[:, None] * np.ones((1, 3), int), np.arange(100)
    sub_tokens, sub_labels = evaluation.validation_subset((tokens, labels), 10, seed=0)
    assert len(sub_labels) == 10 and np.all(np.diff(sub_labels) > 0)  # distinct, in split order
    assert np.array_equal(sub_tokens[:, 0], sub_labels)  # rows stay with their labels
    assert np.array_equal(evaluation.validation_subset((tokens, labels), 10, seed=0)[1], sub_labels)
    assert not np.array_equal(evaluation.validation_subset((tokens, labels), 10, seed=1)[1], sub_labels)
    for everything in (0, 100, 500):
        assert evaluation.validation_subset((tokens, labels), everything, seed=0)[1] is labels


def test_empty_splits_are_named_in_one_error(tmp_path):
    config = from_config(tiny_config(tmp_path))
    full = (np.zeros((4, 8), np.int32), np.zeros(4, np.int32))
    empty = (np.zeros((0, 8), np.int32), np.zeros(0, np.int32))
    evaluation.check_not_empty(config, {"train": full, "val": empty}, ["train"])
    with pytest.raises(DataError, match=r"no examples in its val, test splits .*--config\.data\.data_dir"):
        evaluation.check_not_empty(config, {"train": full, "val": empty, "test": empty}, ["train", "val", "test"])
