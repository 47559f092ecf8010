"""lm-evaluation-harness adapter: a memorised multiple-choice task is answered, shuffled labels are not;
log-likelihoods equal the model's own losses; generate_until stops at the task's strings. Fully offline."""

import json
import random

# lm_eval is the [eval] extra, which `make test` installs: a plain import, so that a missing one fails loudly instead
# of skipping this module (and test_cli, which imports it).
import lm_eval
import pytest
import torch

import angpt
from angpt.errors import UserError
from angpt.infer.harness import AngptLM, evaluate_tasks

CAPITALS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Peru": "Lima",
    "Egypt": "Cairo",
    "Kenya": "Nairobi",
    "Chile": "Santiago",
    "Norway": "Oslo",
    "Cuba": "Havana",
}

pytestmark = pytest.mark.usefixtures("one_thread")


_MEMORISED: dict = {}


def memorise_capitals(tok):
    """A tiny anGPT that has memorised "The capital of X is Y." for 8 countries (150 full-batch Adam steps).

    Trained once per session and shared (test_cli evaluates it through `angpt eval`); callers must not modify it.
    """
    if "model" in _MEMORISED:
        return _MEMORISED["model"]
    texts = [f"The capital of {c} is {y}." for c, y in CAPITALS.items()]
    T = max(len(tok.encode(t)) for t in texts) + 1
    x = torch.full((len(texts), T), tok.eos_id)
    y = torch.full((len(texts), T), -100)
    for i, t in enumerate(texts):
        ids = tok.encode(t) + [tok.eos_id]
        x[i, : len(ids) - 1] = torch.tensor(ids[:-1])
        y[i, : len(ids) - 1] = torch.tensor(ids[1:])
    torch.manual_seed(0)
    m = angpt.build_model("angpt", "tiny", vocab_size=tok.vocab_size)
    opt, sched = angpt.make_optimizer(m, lr=1e-2, max_steps=150)
    angpt.attach_constraints(m, opt)
    for _ in range(150):
        m(x, y)[1].backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    _MEMORISED["model"] = m.eval()
    return _MEMORISED["model"]


@pytest.fixture(scope="module")
def model(tok):
    return memorise_capitals(tok)


def write_tasks(folder):
    """Two multiple-choice tasks over the same 8 questions: true labels, and labels moved to a wrong choice."""
    capitals = list(CAPITALS.values())
    with open(folder / "capitals.jsonl", "w") as f:
        for i, (country, capital) in enumerate(CAPITALS.items()):
            rng = random.Random(i)
            choices = [capital] + rng.sample([c for c in capitals if c != capital], 3)
            rng.shuffle(choices)
            label = choices.index(capital)
            row = {"country": country, "choices": choices, "label": label, "wrong": (label + 1) % 4}
            f.write(json.dumps(row) + "\n")
    for name, target in [("capitals_true", "label"), ("capitals_shuffled", "wrong")]:
        (folder / f"{name}.yaml").write_text(
            f"task: {name}\n"
            "dataset_path: json\n"
            f"dataset_kwargs:\n  data_files:\n    test: {folder / 'capitals.jsonl'}\n"
            "test_split: test\n"
            "output_type: multiple_choice\n"
            'doc_to_text: "The capital of {{country}} is"\n'
            "doc_to_choice: choices\n"
            f"doc_to_target: {target}\n"
            "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
        )


def test_memorised_facts_score_high_and_shuffled_labels_low(model, tok, tmp_path):
    write_tasks(tmp_path)
    out = evaluate_tasks(model, tok, ["capitals_true", "capitals_shuffled"], include_path=tmp_path, batch_size=4)
    true_acc = out["results"]["capitals_true"]["acc,none"]
    shuffled_acc = out["results"]["capitals_shuffled"]["acc,none"]
    assert true_acc >= 0.75
    assert shuffled_acc <= 0.25 < true_acc - 0.5  # chance is 0.25; a memorised fact makes any other label lose


def request(kind, *args):
    from lm_eval.api.instance import Instance

    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


def test_loglikelihood_rolling_equals_model_loss(model, tok):
    lm = AngptLM(model=model, tokenizer=tok, batch_size=3)
    short = "The capital of Peru is Lima."
    long = " ".join(f"The capital of {c} is {y}." for c, y in CAPITALS.items())  # > 64 tokens: several windows
    got = lm.loglikelihood_rolling([request("loglikelihood_rolling", short), request("loglikelihood_rolling", long)])

    def own_loss(text):
        # Disjoint chunks of up to L = 64 predicted tokens; each is scored by one forward over the (up to) L
        # tokens before its end, [EOS] standing before the first token.
        toks = tok.encode(text)
        full = [tok.eos_id] + toks
        total = 0.0
        for lo in range(0, len(toks), 64):
            hi = min(lo + 64, len(toks))
            start = max(0, hi - 64)
            inp = full[start:hi]
            target = [-100] * (lo - start) + toks[lo:hi]
            with torch.no_grad():
                _, loss = model(torch.tensor([inp]), torch.tensor([target]))
            total -= loss.item() * (hi - lo)
        return total

    assert len(tok.encode(long)) > 2 * 64
    assert got[0] == pytest.approx(own_loss(short), rel=1e-5)
    assert got[1] == pytest.approx(own_loss(long), rel=1e-5)


def test_loglikelihood_batching_and_greedy_flag(model, tok):
    reqs = [request("loglikelihood", f"The capital of {c} is", f" {y}") for c, y in CAPITALS.items()]
    reqs.append(request("loglikelihood", "The capital of France is", " Lima"))
    one = AngptLM(model=model, tokenizer=tok, batch_size=1).loglikelihood(reqs)
    many = AngptLM(model=model, tokenizer=tok, batch_size=4).loglikelihood(reqs)
    for (a, ga), (b, gb) in zip(one, many):
        assert a == pytest.approx(b, abs=1e-4) and ga == gb
    assert all(greedy for _, greedy in one[:-1]) and not one[-1][1]
    assert one[-1][0] < one[0][0] - 5  # " Lima" after France is far less likely than " Paris"
    ctx, cont = tok.encode("The capital of Peru is"), tok.encode(" Lima")
    with torch.no_grad():
        _, loss = model(torch.tensor([ctx + cont[:-1]]), torch.tensor([[-100] * (len(ctx) - 1) + cont]))
    assert one[2][0] == pytest.approx(-loss.item() * len(cont), rel=1e-5)


def test_generate_until_stops_at_task_strings(model, tok):
    lm = AngptLM(model=model, tokenizer=tok, batch_size=2)
    reqs = [request("generate_until", f"The capital of {c} is", {"until": ["."], "max_gen_toks": 20}) for c in CAPITALS]
    assert lm.generate_until(reqs) == [f" {y}" for y in CAPITALS.values()]


def test_model_type_is_registered_and_needs_a_model():
    from lm_eval.api.registry import get_model

    assert get_model("angpt") is AngptLM
    with pytest.raises(UserError, match="checkpoint=PATH"):
        AngptLM()


def test_checkpoint_model_args_through_simple_evaluate(model, tok, tmp_path):
    """The string form lm_eval users write: model="angpt", model_args="checkpoint=PATH"."""
    from lm_eval.tasks import TaskManager

    from angpt.checkpoint import save_checkpoint

    tok.save(tmp_path / "tok")
    ckpt = save_checkpoint(
        tmp_path / "run",
        150,
        model.state_dict(),
        {},
        {"model_config": model.config.to_dict()},
        tokenizer_dir=tmp_path / "tok",
    )
    write_tasks(tmp_path)
    out = lm_eval.simple_evaluate(
        model="angpt",
        model_args=f"checkpoint={ckpt}",
        tasks=["capitals_true"],
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        batch_size=8,
        bootstrap_iters=0,
    )
    assert out["results"]["capitals_true"]["acc,none"] >= 0.75
