"""Loading task directories, importing their references, and turning get_inputs into configurations."""

from __future__ import annotations

import textwrap
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from tpu_runner.tasks import (
    KNOWN_FAMILIES,
    ArgSpec,
    Configuration,
    TaskError,
    abstract_configurations,
    concrete_configurations,
    discover_tasks,
    import_reference,
    load_task,
    split_configurations,
)

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "tasks"
SHIPPED = sorted(p.name for p in SUITE.iterdir() if (p / "kernel_task.yaml").is_file())

REFERENCE = textwrap.dedent("""\
    import jax.numpy as jnp


    def computation(x, scale):
        return x * scale


    def get_inputs():
        return [jnp.ones((8, 128), jnp.float32)], [2.0]
""")
META = "task_id: toy\ndescription: a toy task\nfamily: elementwise\natol: 1.0e-5\nrtol: 1.0e-5\n"


def _task_dir(root: Path, *, reference: str | None = REFERENCE, meta: str | None = META,
              name: str = "toy") -> Path:
    path = root / name
    path.mkdir()
    if reference is not None:
        (path / "reference.py").write_text(reference)
    if meta is not None:
        (path / "kernel_task.yaml").write_text(meta)
    return path


def _error(path: Path) -> str:
    with pytest.raises(TaskError) as info:
        load_task(path)
    return str(info.value)


# --- load_task ----------------------------------------------------------------------------------------------


def test_the_suite_has_seventeen_tasks():
    assert len(SHIPPED) == 17
    assert [p.name for p in discover_tasks(SUITE)] == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_task_loads(name):
    task = load_task(SUITE / name)
    assert task.task_id == name
    assert task.description
    assert task.family in KNOWN_FAMILIES
    assert task.atol and all(a > 0 for a in task.atol)
    assert task.rtol and all(r > 0 for r in task.rtol)
    assert task.param_count is not None and task.param_count >= 1
    assert len(task.digest) == 16
    assert task.reference_path == SUITE / name / "reference.py"


def test_toy_task_loads_with_its_fields(tmp_path):
    task = load_task(_task_dir(tmp_path))
    assert (task.task_id, task.description, task.family) == ("toy", "a toy task", "elementwise")
    assert (task.atol, task.rtol) == ((1e-5,), (1e-5,))
    assert task.allow_pure_jax is False
    assert task.input_gen_code is None
    assert task.param_count == 2


def test_task_id_defaults_to_the_directory_name(tmp_path):
    task = load_task(_task_dir(tmp_path, meta="atol: 0.1\nrtol: 0\n", name="unnamed"))
    assert task.task_id == "unnamed"
    assert task.tolerance(0) == (0.1, 0.0)


def test_digest_changes_with_either_file(tmp_path):
    a = load_task(_task_dir(tmp_path, name="a"))
    b = load_task(_task_dir(tmp_path, name="b", meta=META.replace("1.0e-5\nrtol", "2.0e-5\nrtol")))
    c = load_task(_task_dir(tmp_path, name="c", reference=REFERENCE + "\n# changed\n"))
    same = load_task(_task_dir(tmp_path, name="same"))
    assert len({a.digest, b.digest, c.digest}) == 3
    assert same.digest == a.digest


def test_missing_directory(tmp_path):
    message = _error(tmp_path / "nowhere")
    assert "does not exist" in message
    assert "nowhere" in message


def test_missing_reference(tmp_path):
    message = _error(_task_dir(tmp_path, reference=None))
    assert "missing reference.py" in message


def test_missing_yaml(tmp_path):
    message = _error(_task_dir(tmp_path, meta=None))
    assert "missing kernel_task.yaml" in message


def test_missing_both_files_names_both(tmp_path):
    message = _error(_task_dir(tmp_path, reference=None, meta=None))
    assert "reference.py, kernel_task.yaml" in message


@pytest.mark.parametrize("key", ["atol", "rtol"])
def test_yaml_without_a_tolerance(tmp_path, key):
    meta = "\n".join(line for line in META.splitlines() if not line.startswith(key))
    message = _error(_task_dir(tmp_path, meta=meta))
    assert f"missing '{key}'" in message


@pytest.mark.parametrize(("value", "shown"), [("-1.0e-3", "-0.001"), (".nan", "nan"), ('"small"', "'small'"),
                                              ("true", "True"), ("[]", "empty list"), ("[1.0e-3, -1]", "-1")])
def test_yaml_with_a_bad_atol(tmp_path, value, shown):
    meta = META.replace("atol: 1.0e-5", f"atol: {value}")
    message = _error(_task_dir(tmp_path, meta=meta))
    assert "'atol'" in message
    assert shown in message


def test_yaml_tolerances_written_without_a_dot(tmp_path):
    # PyYAML (YAML 1.1) reads `1e-2` as the string '1e-2'; it is the number people mean.
    task = load_task(_task_dir(tmp_path, meta=META.replace("atol: 1.0e-5", "atol: 1e-2")))
    assert task.atol == (1e-2,)
    message = _error(_task_dir(tmp_path, name="two", meta=META.replace("atol: 1.0e-5", "atol: [1e-2, 1e-x]")))
    assert "'1e-x'" in message


def test_invalid_yaml(tmp_path):
    message = _error(_task_dir(tmp_path, meta="atol: [1.0\nrtol: 1\n"))
    assert "not valid YAML" in message


def test_yaml_that_is_not_a_mapping(tmp_path):
    message = _error(_task_dir(tmp_path, meta="- atol\n- rtol\n"))
    assert "expected a mapping" in message


def test_syntax_error_in_the_reference(tmp_path):
    message = _error(_task_dir(tmp_path, reference="def computation(x:\n    return x\n"))
    assert "syntax error in the reference" in message
    assert "reference.py:1" in message


def test_unknown_family(tmp_path):
    message = _error(_task_dir(tmp_path, meta=META.replace("family: elementwise", "family: sorting")))
    assert "'sorting'" in message
    assert "matmul" in message  # the known families are listed


def test_per_configuration_tolerances(tmp_path):
    meta = "atol: [1.0e-3, 2.0e-3]\nrtol: 1.0e-4\n"
    task = load_task(_task_dir(tmp_path, meta=meta))
    assert task.atol == (1e-3, 2e-3)
    assert task.tolerance(0) == (1e-3, 1e-4)
    assert task.tolerance(1) == (2e-3, 1e-4)
    assert task.tolerance(5) == (2e-3, 1e-4)  # the last value covers later configurations


# --- import_reference ---------------------------------------------------------------------------------------


def test_import_reference_gives_a_callable_computation(tmp_path):
    module = import_reference(load_task(_task_dir(tmp_path)))
    assert float(module.computation(jnp.ones(()), 3.0)) == 3.0
    assert import_reference(load_task(tmp_path / "toy")) is module  # cached by digest


def test_reference_that_raises_at_import(tmp_path):
    reference = REFERENCE + "\nraise RuntimeError('no such dataset')\n"
    task = load_task(_task_dir(tmp_path, reference=reference))
    with pytest.raises(TaskError) as info:
        import_reference(task)
    assert "RuntimeError: no such dataset" in str(info.value)
    assert "reference.py" in str(info.value)


def test_reference_without_get_inputs(tmp_path):
    reference = "def computation(x):\n    return x\n"
    task = load_task(_task_dir(tmp_path, reference=reference))
    with pytest.raises(TaskError, match=r"must define get_inputs\(\)"):
        import_reference(task)


def test_input_gen_code_supplies_get_inputs(tmp_path):
    reference = "def computation(x):\n    return x * 2\n"
    code = "import jax.numpy as jnp\n\n"
    code += "def get_inputs():\n    return [jnp.zeros((4, 256), jnp.bfloat16)], []\n"
    meta = "atol: 1.0e-2\nrtol: 1.0e-2\ninput_gen_code: |\n" + textwrap.indent(code, "  ")
    task = load_task(_task_dir(tmp_path, reference=reference, meta=meta))
    assert task.input_gen_code == code
    module = import_reference(task)
    assert callable(module.get_inputs)
    (config,) = abstract_configurations(task)
    assert config.dynamic == (ArgSpec((4, 256), "bfloat16"),)


def test_input_gen_code_does_not_replace_an_existing_get_inputs(tmp_path):
    code = "def get_inputs():\n    raise AssertionError('should not run')\n"
    meta = META + "input_gen_code: |\n" + textwrap.indent(code, "  ")
    task = load_task(_task_dir(tmp_path, meta=meta))
    (config,) = abstract_configurations(task)
    assert config.dynamic == (ArgSpec((8, 128), "float32"),)


# --- split_configurations -----------------------------------------------------------------------------------


def test_split_a_single_pair():
    x, y = np.zeros((2, 3), np.float32), np.ones((3,), np.int32)
    ((dynamic, static),) = split_configurations(([x, y], [1e-5, 4]), "here")
    assert dynamic[0] is x and dynamic[1] is y
    assert static == [1e-5, 4]


def test_split_a_list_of_pairs():
    a, b = np.zeros((2,)), np.zeros((4,))
    pairs = split_configurations([([a], [1]), ([b], [2])], "here")
    assert [(d[0].shape, s) for d, s in pairs] == [((2,), [1]), ((4,), [2])]


@pytest.mark.parametrize("value", [None, 3, "inputs", [], np.zeros((2,)), ([np.zeros(2)],),
                                   ([np.zeros(2)], [np.zeros(2)]), [([np.zeros(2)], []), "junk"]])
def test_split_garbage(value):
    expected = r"^somewhere: get_inputs\(\) must return \(dynamic_args, static_args\)"
    with pytest.raises(TaskError, match=expected):
        split_configurations(value, "somewhere: get_inputs()")


# --- configurations -----------------------------------------------------------------------------------------


def test_abstract_configurations_of_softmax_are_shapes_only():
    task = load_task(SUITE / "softmax")
    (config,) = abstract_configurations(task)
    assert config == Configuration(dynamic=(ArgSpec((8192, 8192), "float32"),), static=())
    assert config.values is None
    assert config.dynamic[0].nbytes == 8192 * 8192 * 4


def test_abstract_configurations_keep_statics():
    task = load_task(SUITE / "layer_norm")
    (config,) = abstract_configurations(task)
    assert [a.shape for a in config.dynamic] == [(8192, 4096), (4096,), (4096,)]
    assert config.static == (1e-5,)
    assert config.static_argnums == (3,)
    assert config.describe() == "float32[8192,4096], float32[4096], float32[4096], 1e-05"


def test_get_inputs_returning_two_configurations(tmp_path):
    reference = textwrap.dedent("""\
        import jax.numpy as jnp


        def computation(x, n):
            return x * n


        def get_inputs():
            return [([jnp.ones((8, 128))], [1]), ([jnp.ones((16, 256), jnp.bfloat16)], [2])]
    """)
    task = load_task(_task_dir(tmp_path, reference=reference, meta="atol: [0.1, 0.2]\nrtol: [0.01, 0.02]\n"))
    configs = abstract_configurations(task)
    assert [(c.dynamic[0].shape, c.dynamic[0].dtype, c.static) for c in configs] == [
        ((8, 128), "float32", (1,)), ((16, 256), "bfloat16", (2,))]
    assert [task.tolerance(i) for i in range(len(configs))] == [(0.1, 0.01), (0.2, 0.02)]


def test_untraceable_get_inputs_falls_back_to_running_it(tmp_path):
    reference = textwrap.dedent("""\
        import jax
        import jax.numpy as jnp


        def computation(i):
            return i


        def get_inputs():
            x = jax.random.uniform(jax.random.PRNGKey(0), (4,))
            rows = 3 if float(jnp.max(x)) < 2.0 else 5  # a concrete value: not traceable by eval_shape
            return [jnp.arange(rows * 8, dtype=jnp.int32).reshape(rows, 8)], []
    """)
    task = load_task(_task_dir(tmp_path, reference=reference))
    (abstract,) = abstract_configurations(task)
    # The fallback ran get_inputs for real; only the values themselves are dropped.
    assert [(a.shape, a.dtype) for a in abstract.dynamic] == [((3, 8), "int32")]
    assert abstract.static == ()
    assert abstract.values is None
    (concrete,) = concrete_configurations(task, "get_inputs")
    assert concrete.dynamic == (ArgSpec((3, 8), "int32", (0, 23)),)
    assert concrete.values is not None and np.array_equal(concrete.values[0], np.arange(24).reshape(3, 8))


def test_get_inputs_returning_garbage_is_a_task_error(tmp_path):
    reference = "def computation(x):\n    return x\n\ndef get_inputs():\n    return 42\n"
    task = load_task(_task_dir(tmp_path, reference=reference))
    with pytest.raises(TaskError, match=r"get_inputs\(\) must return"):
        abstract_configurations(task)


def test_get_inputs_that_raises_is_a_task_error(tmp_path):
    reference = "def computation(x):\n    return x\n\ndef get_inputs():\n    raise KeyError('seed')\n"
    task = load_task(_task_dir(tmp_path, reference=reference))
    with pytest.raises(TaskError, match=r"get_inputs\(\) raised KeyError"):
        abstract_configurations(task)
