"""What a run leaves and gives back: its experiment folder (experiment: made atomically, locked
while a run uses it, the state a resume reads), what that folder records read back (records), the
plots drawn from it (plots), and the RunResult a run returns, a submitted one's through its signed
result line (run_result)."""
