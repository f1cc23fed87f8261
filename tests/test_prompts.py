import pytest

from sdeth.models import prompts as P


@pytest.mark.parametrize("spec", ["sharegtp:4", "sharegpt", "sharegpt:x", "sharegpt:0", "humaneval:2:z", "sharegpt:1:2:3"])
def test_bad_spec_names_the_value(spec):
    with pytest.raises(P.PromptError, match="prompt set"):
        P.parse_spec(spec)


def test_sharegpt_reads_every_complete_conversation_before_the_cut():
    rows = P.sharegpt_first_turns()
    assert len(rows) == 17671          # the wheel's JSON is cut mid-string at 125 MB


def test_held_out_split_is_disjoint_from_training_split():
    train = {p.id for p in P._sharegpt(train=True)}
    test = {p.id for p in P._sharegpt(train=False)}
    assert test and train and not train & test


def test_sampling_is_deterministic_and_seeded():
    assert [p.id for p in P.load("sharegpt:5:3")] == [p.id for p in P.load("sharegpt:5:3")]
    assert [p.id for p in P.load("sharegpt:5:3")] != [p.id for p in P.load("sharegpt:5:4")]
    assert all(P.SHAREGPT_MIN_CHARS <= len(p.text) <= P.SHAREGPT_MAX_CHARS for p in P.load("sharegpt:50"))


def test_humaneval():
    ps = P.load("humaneval:164")
    assert len(ps) == 164 and all("def " in p.text for p in ps)
    with pytest.raises(P.PromptError, match="only 164"):
        P.load("humaneval:200")


def test_chat_template_and_raw(pair):
    p = P.load("humaneval:1")[0]
    chat = pair.tokenizer.decode(P.encode(p, pair.tokenizer, chat=True))
    raw = pair.tokenizer.decode(P.encode(p, pair.tokenizer, chat=False))
    assert chat.startswith("<|im_start|>system") and chat.rstrip().endswith("<|im_start|>assistant")
    assert "<|im_start|>" not in raw


def test_random_prompt_spec():
    assert P.parse_spec("random:16:512:3") == ("random", 16, 3)
    ids = P.random_ids("random:2:5:7", 100)
    assert [i for i, _ in ids] == ["random/7", "random/8"] and all(len(t) == 5 and max(t) < 100 for _, t in ids)
    assert ids[0][1] != ids[1][1] and P.random_ids("random:2:5:7", 100) == ids
    for bad in ("random:16", "random:0:5", "random:a:5", "random:2:5:1:9"):
        with pytest.raises(P.PromptError, match="random:N:LEN"):
            P.parse_spec(bad)
