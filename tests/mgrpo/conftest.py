import pytest

from mgrpo.models import build_model, train_tokenizer
from mgrpo.tasks.deep_research import DeepResearchTask
from mgrpo.tasks.world import generate_world


@pytest.fixture(scope="session")
def small_task():
    return DeepResearchTask(generate_world(0, n_people=200))


@pytest.fixture(scope="session")
def tokenizer(small_task):
    return train_tokenizer([d.text for d in small_task.world.docs], 320)


@pytest.fixture(scope="session")
def tiny_model(tokenizer):
    return build_model("tiny", tokenizer, seed=0)
