DROP FUNCTION /* TEMPLATE: schema */sagabox_check(boolean, text, text);
