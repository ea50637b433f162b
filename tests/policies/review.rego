package ringlet

import rego.v1

require_approval contains "payments need a second pair of eyes" if {
	input.resource.tool == "refund"
}
