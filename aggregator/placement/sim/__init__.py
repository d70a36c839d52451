"""The simulator, `hypertopo-scheduler simulate`: discrete-event replay of job traces, the
placement policies it compares, and its ledgers of spares and recoveries."""
