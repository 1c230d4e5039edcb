"""grain loaders: deterministic from the seed, resumable, sharded across processes."""

import json

import grain
import pytest

from grpo_jax import data

NUM = 300  # arithmetic_config.num_train


@pytest.fixture(scope="module")
def source(data_dir, arithmetic_config):
    return data.data_source("arithmetic", split="train", data_dir=data_dir,
                            config=arithmetic_config)


def single_process(**kwargs):
    return grain.sharding.ShardOptions(shard_index=0, shard_count=1, **kwargs)


def questions(loader, n=None):
    iterator = iter(loader)
    items = list(iterator) if n is None else [next(iterator) for _ in range(n)]
    return [example["question"] for example in items]


class TestOrder:

    def test_one_epoch_is_a_permutation_of_the_split(self, source):
        got = questions(data.make_loader(source, seed=0, shard_options=single_process()))
        expected = [data.decode_example(r)["question"] for r in source]
        assert len(got) == NUM
        assert sorted(got) == sorted(expected)
        assert got != expected  # shuffled

    def test_same_seed_same_order_other_seed_other_order(self, source):
        first = questions(data.make_loader(source, seed=3, shard_options=single_process()))
        again = questions(data.make_loader(source, seed=3, shard_options=single_process()))
        other = questions(data.make_loader(source, seed=4, shard_options=single_process()))
        assert first == again
        assert first != other

    def test_no_shuffle_keeps_source_order(self, source):
        got = questions(data.make_loader(source, seed=0, shuffle=False,
                                         shard_options=single_process()))
        assert got == [data.decode_example(r)["question"] for r in source]

    def test_epochs_are_reshuffled_and_complete(self, source):
        got = questions(data.make_loader(source, seed=0, num_epochs=2,
                                         shard_options=single_process()))
        assert len(got) == 2 * NUM
        first, second = got[:NUM], got[NUM:]
        assert sorted(first) == sorted(second)
        assert first != second

    def test_batches_and_transform(self, source):
        loader = data.make_loader(
            source, seed=0, batch_size=64, shard_options=single_process(),
            transform=lambda ex: {**ex, "prompt": data.format_prompt(ex)})
        batches = list(loader)
        assert [len(b) for b in batches] == [64, 64, 64, 64, 44]
        example = batches[0][0]
        assert example["prompt"] == example["question"] + "="


class TestResume:

    @pytest.mark.parametrize("num_epochs, batch_size, stop_at", [
        (1, None, 17), (None, None, 450), (None, 8, 40)])
    def test_restart_continues_at_the_next_example(self, source, num_epochs, batch_size,
                                                   stop_at):
        def make():
            return data.make_loader(source, seed=11, num_epochs=num_epochs,
                                    batch_size=batch_size, shard_options=single_process())

        reference = iter(make())
        expected = [next(reference) for _ in range(stop_at + 5)]

        interrupted = iter(make())
        for _ in range(stop_at):
            next(interrupted)
        state = json.loads(json.dumps(interrupted.get_state()))  # as a checkpoint stores it
        del interrupted

        restarted = iter(make())
        restarted.set_state(state)
        assert [next(restarted) for _ in range(5)] == expected[stop_at:]


class TestSharding:

    @pytest.mark.parametrize("count", [1, 3, 7])
    def test_processes_together_read_every_example_once(self, source, count):
        seen = []
        for index in range(count):
            options = grain.sharding.ShardOptions(shard_index=index, shard_count=count)
            seen += questions(data.make_loader(source, seed=5, shard_options=options))
        assert len(seen) == NUM
        assert sorted(seen) == sorted(data.decode_example(r)["question"] for r in source)

    def test_drop_remainder_gives_equal_shards(self, source):
        sizes = []
        for index in range(7):
            options = grain.sharding.ShardOptions(index, 7, drop_remainder=True)
            sizes.append(len(questions(data.make_loader(source, seed=5, shard_options=options))))
        assert sizes == [NUM // 7] * 7

    def test_default_is_this_jax_process(self, source):
        got = questions(data.make_loader(source, seed=5))  # one process in tests
        assert len(got) == NUM

    @pytest.mark.parametrize("num, count", [(10, 3), (9, 3), (2, 4), (0, 2)])
    def test_shard_bounds_tile_the_range(self, num, count):
        bounds = [data.shard_bounds(num, grain.sharding.ShardOptions(i, count))
                  for i in range(count)]
        assert bounds[0][0] == 0 and bounds[-1][1] == num
        assert all(stop == start for (_, stop), (start, _) in zip(bounds, bounds[1:]))
        sizes = [stop - start for start, stop in bounds]
        assert max(sizes) - min(sizes) <= 1
