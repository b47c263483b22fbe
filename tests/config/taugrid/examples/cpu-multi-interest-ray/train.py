print("stub entrypoint for the ported TauGrid example")
