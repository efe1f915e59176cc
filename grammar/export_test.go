package grammar

// ParseAndValidate is parseAndValidate for the external tests, which run
// the engine (and so cannot live in package grammar: the engine imports it).
var ParseAndValidate = parseAndValidate
