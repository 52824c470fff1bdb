"""Operators: `IrisFederatedOperator` submits a whole root job and waits for it;
`IrisReceivedJobOperator` watches a job another cluster handed to this one.
"""
