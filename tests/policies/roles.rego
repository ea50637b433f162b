package ringlet.ops

import rego.v1

# Destructive tools need the platform-admin role.
deny contains msg if {
	input.resource.effect == "destructive"
	not "platform-admin" in input.subject.roles
	msg := "destructive operations need the platform-admin role"
}
