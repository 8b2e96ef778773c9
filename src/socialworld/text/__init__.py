"""Every text template of the project, versioned, and the one owner of the agent's BELIEF/ACTION/SAY reply format."""
