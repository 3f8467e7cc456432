"""The two records every layer passes around: a request (`request.Request`) and an engine step
(`step.StepPlan`)."""
