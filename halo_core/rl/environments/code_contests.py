"""``code_contests``: the model may test a solution against the row's tests before it answers.

Rows carry ``prompt`` (the problem) and ``tests`` (statements such as ``assert f(2) == 4``, as for the
``code_tests`` reward). ``run_tests(code)`` runs the code, then each test, in the sandbox
(``halo_core.rl.sandbox``: isolated by the OS, each test graded from outside the solution's process) and
tells the model how many passed and the first failure. The reward (``get_reward``) is the share of tests passed by
the last code it ran, 0 when it ran none: the environment never sees the final message, so to score the final
answer's code as well add ``code_tests`` to ``reward_funcs`` (all tests or nothing, the same sandbox).
"""

from __future__ import annotations

from halo_core.rl import execution
from halo_core.rl.rewards import code_block
from halo_core.rl.sandbox import executes_code, run_tests


@executes_code
class CodeContests:
    """One rollout's problem; subclass it to change the limits."""

    timeout_s = 5.0
    memory_mb = 512

    def reset(self, tests=None, **row) -> None:
        if tests is None:
            raise ValueError("environment 'code_contests' needs a 'tests' column (a list of assert statements) in every row")
        self._tests = [str(test) for test in tests]
        self._score = 0.0

    def run_tests(self, code: str) -> str:
        """Run a Python solution against the problem's hidden tests.

        Args:
            code: The whole solution, Python source defining what the tests call.

        Returns:
            How many tests passed, and the first failure.
        """
        # The instance (its tests, its score) stays with the rollout; only the execution goes to the pool or Ray.
        report = execution.run_one(run_tests, code_block(code), self._tests, self.timeout_s, self.memory_mb)
        if report is None:
            self._score = 0.0
            return f"0/{len(self._tests)} tests passed; the grader's worker crashed"
        self._score = report.fraction
        return report.summary(self.timeout_s)

    def get_reward(self) -> float:
        return self._score
