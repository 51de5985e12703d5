"""What the evaluator and its children say to each other and answer: the result (`result`), the structured errors made
from JAX, Pallas, Mosaic and XLA exceptions (`errors`), the typed records of the parent-child protocol
(`protocol`), and the one-chart-at-a-time rule every chart shown to people is drawn under (`drawing`)."""

from tpu_runner import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "Correctness": "result", "CorrectnessCase": "result", "EvalError": "result", "EvalResult": "result",
    "failure": "result", "Host": "result", "Performance": "result", "Stage": "result", "Verdict": "result",
    "candidate_line": "errors", "classify_text": "errors", "from_exception": "errors",
    "interpreter_limitation": "errors",
    "Budget": "protocol", "CandidateReport": "protocol", "CandidateRequest": "protocol", "CaseOutput": "protocol",
    "CheckReport": "protocol", "ChildStart": "protocol", "CompileReply": "protocol", "CompileRequest": "protocol",
    "ExportedTask": "protocol", "MeasuredTimes": "protocol", "OutputJob": "protocol", "ProgramReport": "protocol",
    "ReferenceReport": "protocol", "ReferenceRequest": "protocol", "SandboxLimits": "protocol", "timed": "protocol",
    "MEMORY_LIMIT_ENV": "protocol", "KeptDifference": "protocol",
    "write_json": "protocol",
    "draws_alone": "drawing",
})
