"""The composition: build.py's run_build is the short pipeline of build/'s stages, with the stages that drive
other packages (precision: the auto search and fallback; qat; prune) and the sensitivity command's build.
Nothing below imports it.
"""
