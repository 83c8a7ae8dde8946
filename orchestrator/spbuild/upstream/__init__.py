"""Following upstream: rebasing the series, bisecting where a patch broke, the series' health."""
