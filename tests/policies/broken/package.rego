package company.rules

import rego.v1

deny contains "no" if { true }
