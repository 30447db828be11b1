"""The simulator and Plan on hand-built graphs, where every number can be checked by hand."""

import pytest

from remat.errors import InvalidPlanError
from remat.graph import BACKWARD, GraphBuilder
from remat.plan import COMPUTE, FREE, Instruction, Plan, simulate
from remat.solvers import solve


def chain(n=4, size=100):
    """x -> f1 -> ... -> fn (forward), then b_n ... b_1 (backward), grads of n 'weights'."""
    b = GraphBuilder("chain")
    x = b.input("x", 1000)
    t = b.tangent("t", 1)
    acts = [x]
    for i in range(1, n + 1):
        (a,) = b.op(f"f{i}", [acts[-1]], [size], cost=1.0)
        acts.append(a)
    (loss,) = b.op("loss", [acts[-1]], [1], cost=1.0)
    grad = t
    grads = []
    for i in range(n, 0, -1):
        (g_in, g_w) = b.op(f"b{i}", [grad, acts[i], acts[i - 1]], [size, 10], phase=BACKWARD, cost=2.0)
        grad = g_in
        grads.append(g_w)
    return b.build(forward_outputs=[loss], backward_outputs=grads)


def test_store_all_peak_by_hand():
    g = chain(n=3, size=100)
    plan = solve("store_all", g, None)
    # forward keeps a1..a3 (300) + loss (1); the tangent (1) arrives at the boundary.
    # b3: 302 resident + its outputs 110 = 412; then a3 and the tangent are freed, b2 runs with
    # a1, a2 (200) + b3's g_in (100) + g_w3 (10) + loss (1) + its outputs 110 = 421
    assert plan.peak_bytes == 421
    assert plan.compute_seconds == pytest.approx(4 * 1.0 + 3 * 2.0)
    assert plan.overhead == pytest.approx(0.0)
    assert [g.values[v].name for v in plan.saved_values] == ["f1", "f2", "f3"]


def test_checkpoint_all_lowers_peak_and_costs_more():
    g = chain(n=6, size=100)
    store = solve("store_all", g, None)
    ckpt = solve("checkpoint_all", g, None)
    assert ckpt.peak_bytes < store.peak_bytes
    assert ckpt.compute_seconds > store.compute_seconds
    assert ckpt.recomputations > 0


def test_chen_sqrt_between_extremes():
    g = chain(n=16, size=100)
    store, chen, ckpt = (solve(s, g, None) for s in ("store_all", "chen_sqrt", "checkpoint_all"))
    assert ckpt.peak_bytes <= chen.peak_bytes < store.peak_bytes
    assert store.compute_seconds < chen.compute_seconds < ckpt.compute_seconds


def test_invalid_plans_name_the_instruction():
    g = chain(n=2)
    f1, f2 = 0, 1
    with pytest.raises(InvalidPlanError, match=r"instruction 0 compute\(f2\): input f1 is not resident"):
        simulate(g, [Instruction(COMPUTE, f2)], 1)
    with pytest.raises(InvalidPlanError, match=r"free\(f1\): the value is not resident"):
        a1 = g.nodes[f1].outputs[0]
        simulate(g, [Instruction(COMPUTE, f1), Instruction(FREE, a1), Instruction(FREE, a1)], 3)
    with pytest.raises(InvalidPlanError, match="backward node cannot run before the forward ends"):
        simulate(g, [Instruction(COMPUTE, f1), Instruction(COMPUTE, f2), Instruction(COMPUTE, 3)], 3)
    with pytest.raises(InvalidPlanError, match="forward output loss is not resident"):
        simulate(g, [Instruction(COMPUTE, f1)], 1)


def test_lost_gradient_is_invalid():
    g = chain(n=2)
    plan = solve("store_all", g, None)
    ins = list(plan.instructions)
    grad = g.backward_outputs[0]
    with pytest.raises(InvalidPlanError, match="backward output .* is not resident"):
        Plan(g, tuple(ins) + (Instruction(FREE, grad),), plan.boundary)


def test_a_plan_that_leaves_a_backward_node_out_is_invalid():
    """Its effect (a gradient's part, an optimizer update) would be lost silently, and the lower bounds
    assume every backward node runs."""
    b = GraphBuilder("dead")
    x, t = b.input("x", 1000), b.tangent("t", 1)
    (a,) = b.op("f", [x], [100])
    (loss,) = b.op("loss", [a], [1])
    (g,) = b.op("b", [t, a], [10], phase=BACKWARD)
    (_side,) = b.op("side", [t], [50], phase=BACKWARD)  # read by nothing
    graph = b.build(forward_outputs=[loss], backward_outputs=[g])
    plan = solve("store_all", graph, None)
    side = next(n.id for n in graph.nodes if n.name == "side")
    kept = [ins for ins in plan.instructions if ins.target != side and not
            (ins.kind == FREE and ins.target == graph.nodes[side].outputs[0])]
    with pytest.raises(InvalidPlanError, match="backward node.* side never run"):
        simulate(graph, kept, plan.boundary)


def test_from_schedule_frees_at_last_use():
    g = chain(n=3)
    plan = solve("store_all", g, None)
    frees = [ins.target for ins in plan.instructions if ins.kind == FREE]
    # every activation but the forward output and the gradients is freed exactly once, and the tangent
    acts = [v.id for v in g.values if v.kind in ("activation", "tangent")]
    expected = set(acts) - set(g.forward_outputs) - set(g.backward_outputs)
    assert sorted(frees) == sorted(expected)


def test_recomputed_random_node_keeps_generator_state():
    b = GraphBuilder("rand")
    x = b.input("x", 10)
    t = b.tangent("t", 1)
    (r,) = b.op("dropout", [x], [100], random=True)
    (y,) = b.op("y", [r], [1])
    (g1,) = b.op("gy", [t, r], [5], phase=BACKWARD)
    g = b.build(forward_outputs=[y], backward_outputs=[g1], meta={"rng_state_bytes": 7})
    once = Plan.from_schedule(g, [0, 1], [2])
    twice = Plan.from_schedule(g, [0, 1], [0, 2])
    # once:  dropout 100, y 101, tangent 102, gy 107
    # twice: dropout 100 + state 7, y 108, free r 8, tangent 9, replay 109 + the generator's current
    # state, held aside while the replay runs, 7 = 116 (state dropped after), gy 107
    assert once.saved_bytes == 100 and twice.saved_bytes == 0
    assert once.peak_bytes == 107 and twice.peak_bytes == 116


def test_plan_save_load_roundtrip(tmp_path):
    g = chain(n=5)
    plan = solve("chen_sqrt", g, 10_000)
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = Plan.load(path)
    assert loaded.peak_bytes == plan.peak_bytes
    assert loaded.compute_seconds == plan.compute_seconds
    assert loaded.instructions == plan.instructions
    assert loaded.graph.structural_hash == g.structural_hash
    assert loaded.solver == "chen_sqrt" and loaded.budget_bytes == 10_000
    assert "chen_sqrt" in loaded.summary()


def _pointwise_chain(reuse: bool):
    """x -> a -> b -> loss, backward g_b -> g_a; with ``reuse``, b may take a's storage (Inductor's in-place)."""
    b = GraphBuilder("pointwise")
    x = b.input("x", 1000)
    t = b.tangent("t", 1)
    (a,) = b.op("a", [x], [100], cost=1.0)
    (bb,) = b.op("b", [a], [100], cost=1.0)
    (loss,) = b.op("loss", [bb], [1], cost=1.0)
    (g_w,) = b.op("grad", [t, x], [10], phase=BACKWARD, cost=1.0)
    meta = {"inplace_reuse": [[1, a, bb]]} if reuse else None
    return b.build(forward_outputs=[loss], backward_outputs=[g_w], meta=meta), a, bb


def test_an_output_written_into_a_dying_input_adds_nothing():
    plain, _, _ = _pointwise_chain(reuse=False)
    graph, a, bb = _pointwise_chain(reuse=True)
    order = dict(forward=[0, 1, 2], backward=[3])
    # without reuse b runs beside a: 100 + 100; with it b is written into a's storage, and the
    # peak is b beside the loss
    unfused = Plan.from_schedule(plain, **order)
    assert unfused.peak_bytes == 200
    reused = Plan.from_schedule(graph, **order)
    assert reused.peak_bytes == 101
    # the free of a released nothing; b's free releases its (a's) storage: nothing is left over
    assert reused.simulation.timeline[-1] == unfused.simulation.timeline[-1]


def _softmax_like(extern_between: bool):
    """x -> s; a row reduction r reads s, then the normaliser n reads s and r and may take s's storage
    (``inplace_reuse``), except where Inductor fuses r and n into one kernel (``inplace_conflicts``).
    With ``extern_between``, an extern kernel (not in ``inductor_kernels``) runs between r and n."""
    b = GraphBuilder("softmax")
    x = b.input("x", 1000)
    t = b.tangent("t", 1)
    (s,) = b.op("scores", [x], [100], cost=1.0)
    (r,) = b.op("rowmax", [s], [10], cost=1.0)
    (e,) = b.op("extern", [x], [1], cost=1.0)
    (p,) = b.op("normalise", [s, r, e], [100], cost=1.0)
    (loss,) = b.op("loss", [p], [1], cost=1.0)
    (g,) = b.op("grad", [t, x], [10], phase=BACKWARD, cost=1.0)
    meta = {"inplace_reuse": [[3, s, p]], "inplace_conflicts": [[3, s, [1]]], "inductor_kernels": [0, 1, 3, 4, 5]}
    graph = b.build(forward_outputs=[loss], backward_outputs=[g], meta=meta)
    rowmax, extern = Instruction(COMPUTE, 1), Instruction(COMPUTE, 2)
    order = [extern, Instruction(COMPUTE, 0), rowmax] if not extern_between else [Instruction(COMPUTE, 0), rowmax, extern]
    instructions = [*order, Instruction(COMPUTE, 3), Instruction(FREE, s), Instruction(FREE, r), Instruction(FREE, e),
                    Instruction(COMPUTE, 4), Instruction(FREE, p), Instruction(COMPUTE, 5)]
    return graph, instructions


def test_no_reuse_where_a_reader_at_another_index_is_fused_into_the_same_kernel():
    # rowmax runs right before the normaliser: one Inductor kernel, which reads s at two indices, so
    # the probabilities get their own buffer: s (100) + r (10) + e (1) + p (100)
    graph, instructions = _softmax_like(extern_between=False)
    assert simulate(graph, instructions, boundary=len(instructions) - 1).peak_bytes == 211
    # an extern kernel between them: two kernels, and p is written into s's storage
    graph, instructions = _softmax_like(extern_between=True)
    assert simulate(graph, instructions, boundary=len(instructions) - 1).peak_bytes == 111


def test_no_reuse_of_an_input_that_lives_on():
    graph, a, bb = _pointwise_chain(reuse=True)
    # a kept until the loss has run (not freed right after b): b cannot take its storage
    instructions = [Instruction(COMPUTE, 0), Instruction(COMPUTE, 1), Instruction(COMPUTE, 2),
                    Instruction(FREE, a), Instruction(FREE, bb), Instruction(COMPUTE, 3)]
    sim = simulate(graph, instructions, boundary=5)
    assert sim.peak_bytes == 201


def _frees_by_forward_walk(graph, forward, backward):
    """The rule of :meth:`Plan.from_schedule`, written the plain way round (a reference): follow each
    value instance from where it is made to its last read, and free it there unless it is a forward
    output's instance live at the boundary or the last instance of a returned gradient."""
    from remat.graph import ACTIVATION, TANGENT

    seq, nf = list(forward) + list(backward), len(forward)
    values, nodes = graph.values, graph.nodes
    instances = []  # [value, made at, last read]
    current = {}
    for pos, nid in enumerate(seq):
        if pos == nf:
            for t in graph.tangents:
                current[t] = len(instances)
                instances.append([t, pos, pos])
        for v in nodes[nid].inputs:
            if values[v].kind in (ACTIVATION, TANGENT) and v in current:
                instances[current[v]][2] = pos
        for v in nodes[nid].outputs:
            current[v] = len(instances)
            instances.append([v, pos, pos])
    last_made = {}
    for k, (v, made, _) in enumerate(instances):
        last_made[v] = k
    at_boundary = {}
    for k, (v, made, _) in enumerate(instances):
        if made < nf:
            at_boundary[v] = k
    outputs = {v for v in graph.forward_outputs if values[v].kind == ACTIVATION}
    grads = {v for v in graph.backward_outputs if values[v].kind in (ACTIVATION, TANGENT)}
    frees = {}
    for k, (v, made, last) in enumerate(instances):
        pinned = (v in outputs and at_boundary.get(v) == k) or (v in grads and last_made.get(v, k) == k)
        if not pinned:
            frees.setdefault(last, []).append(v)
    out = []
    for pos, nid in enumerate(seq):
        out.append(Instruction(COMPUTE, nid))
        out.extend(Instruction(FREE, v) for v in sorted(frees.get(pos, ())))
    return out


def test_schedule_instructions_free_each_instance_after_its_last_read():
    """:func:`remat.plan.schedule_instructions` (one walk from the end) against the plain rule, on
    store_all's and checkpoint_all's schedules and on 40 random ones: the forward in order, the
    backward with random forward nodes recomputed at random places (valid or not: the instructions are
    defined either way)."""
    import random

    from remat.plan import schedule_instructions

    graph = chain(6)
    forward = [n.id for n in graph.nodes if n.phase != BACKWARD]
    backward = [n.id for n in graph.nodes if n.phase == BACKWARD]
    schedules = [solve("store_all", graph, None).schedule(), solve("checkpoint_all", graph, None).schedule(),
                 (forward + backward, [])]
    rng = random.Random(0)
    for _ in range(40):
        bwd = list(backward)
        for _ in range(rng.randrange(6)):
            bwd.insert(rng.randrange(len(bwd) + 1), rng.choice(forward))
        schedules.append((forward, bwd))
    for fwd, bwd in schedules:
        instructions, boundary = schedule_instructions(graph, fwd, bwd)
        assert list(instructions) == _frees_by_forward_walk(graph, fwd, bwd)
        assert instructions[boundary - 1 if boundary else 0].kind in (COMPUTE, FREE)
