"""tfbook.parallel.tour: the sharding chapter's one launch. The chapter runs it (under nbval and
in the book build); these tests check that bad settings are refused before any process starts."""

import dataclasses

import pytest
import torch

from tfbook.models.gpt import GPTConfig
from tfbook.parallel.tour import TourConfig, run_tour, tour_config

IDS = torch.randint(0, 256, (4_000,), generator=torch.Generator().manual_seed(0))


def test_the_chapter_settings_are_valid():
    config = tour_config()
    assert config.model == GPTConfig.tiny()
    assert tour_config(steps=1).steps == 1


@pytest.mark.parametrize(("changes", "error", "words"), [
    ({"batch_size": 7}, ValueError, "batch"),  # not shardable over 2 ranks
    ({"batch_size": 0}, ValueError, "batch_size"),
    ({"steps": True}, ValueError, "steps"),
    ({"seq_len": 10_000}, ValueError, "max_len"),
    ({"n_micro": 3}, ValueError, "n_micro"),  # 8 rows in 3 micro-batches
    ({"bucket_size_mb": 0}, ValueError, "bucket_size_mb"),
    ({"bucket_size_mb": float("nan")}, ValueError, "bucket_size_mb"),
    ({"bubble_micro": ()}, TypeError, "bubble_micro"),
    ({"bubble_micro": [1, 2]}, TypeError, "bubble_micro"),
    ({"ring_length": 30}, ValueError, "ring_length"),
    ({"seed": -1}, ValueError, "seed"),
])
def test_bad_settings_are_refused(changes, error, words):
    with pytest.raises(error, match=words):
        tour_config(**changes)


def test_models_the_tour_cannot_split_are_refused():
    with pytest.raises(ValueError, match="dropout"):
        tour_config(dataclasses.replace(GPTConfig.tiny(), dropout=0.1))
    with pytest.raises(ValueError, match="head"):  # 3 heads over 2 ranks
        tour_config(dataclasses.replace(GPTConfig.tiny(), n_heads=3, d_model=48))
    with pytest.raises(TypeError, match="GPTConfig"):
        TourConfig("tiny")


@pytest.mark.parametrize(("ids", "timeout", "words"), [
    (IDS.float(), 180.0, "integer tensor"),
    (IDS[:10], 180.0, "longer than"),
    (IDS.view(2, -1), 180.0, "1-D"),
    (IDS + 256, 180.0, "vocabulary"),
    (IDS - 1, 180.0, "vocabulary"),
    (IDS, 0, "timeout"),
    (IDS, float("nan"), "timeout"),
])
def test_bad_launch_arguments_are_refused(ids, timeout, words):
    with pytest.raises(ValueError, match=words):
        run_tour(tour_config(), ids, timeout=timeout)
    with pytest.raises(TypeError, match="TourConfig"):
        run_tour({"batch_size": 8}, IDS)
